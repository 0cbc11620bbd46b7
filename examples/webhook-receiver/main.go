// Command webhook-receiver is an example receiver of llmq's webhooks: it
// verifies each delivery's signature with client.VerifyWebhook, answers
// 401 to one that does not verify, drops repeats by webhook-id (a delivery
// is retried until it is answered 2xx, so the same event can come twice),
// and prints each event.
//
//	LLMQ_WEBHOOK_SECRET=whsec_... go run ./examples/webhook-receiver -addr 127.0.0.1:9000
//
// The secret is the tenant's tenants.<tenant>.webhook_secret. See
// docs/webhooks.md.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/llmq/llmq/client"
)

func main() {
	addr := flag.String("addr", envOr("LLMQ_WEBHOOK_ADDR", "127.0.0.1:9000"), "listen address (LLMQ_WEBHOOK_ADDR)")
	flag.Parse()
	// The secret comes from the environment only: a flag would show it in
	// the process list.
	secret := os.Getenv("LLMQ_WEBHOOK_SECRET")
	if secret == "" {
		log.Fatal("set LLMQ_WEBHOOK_SECRET to the tenant's webhook secret (whsec_...)")
	}
	srv := &http.Server{
		Addr:              *addr,
		Handler:           newHandler(secret, time.Now, os.Stdout),
		ReadHeaderTimeout: 10 * time.Second,
	}
	log.Printf("webhook receiver listening on %s", *addr)
	log.Fatal(srv.ListenAndServe())
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// maxBody bounds a delivery's body; llmq's events are far smaller.
const maxBody = 4 << 20

// seenCap bounds the webhook-ids remembered for deduplication. A real
// receiver would keep them in its database, with the work they caused.
const seenCap = 100000

// receiver verifies, dedupes and prints deliveries.
type receiver struct {
	secret string
	now    func() time.Time
	out    io.Writer

	mu    sync.Mutex
	seen  map[string]bool
	order []string // oldest first, to forget the oldest past seenCap
}

func newHandler(secret string, now func() time.Time, out io.Writer) http.Handler {
	return &receiver{secret: secret, now: now, out: out, seen: map[string]bool{}}
}

// event is the part of llmq's result event this example prints.
type event struct {
	Type    string `json:"type"`
	EventID string `json:"event_id"`
	Data    struct {
		ID     string `json:"id"`
		Tenant string `json:"tenant"`
		Status string `json:"status"`
	} `json:"data"`
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	// Verify the raw bytes, before any decoding.
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		http.Error(w, "body too large or unreadable", http.StatusRequestEntityTooLarge)
		return
	}
	if err := client.VerifyWebhook(rc.secret, r.Header, body, rc.now()); err != nil {
		var we *client.WebhookError
		if errors.As(err, &we) {
			http.Error(w, "signature: "+we.Reason.Error(), http.StatusUnauthorized)
			return
		}
		http.Error(w, "signature", http.StatusUnauthorized)
		return
	}
	id := r.Header.Get("webhook-id")
	if !rc.firstTime(id) {
		// Already handled: answer 2xx so that llmq stops retrying.
		w.WriteHeader(http.StatusNoContent)
		return
	}
	var ev event
	if err := json.Unmarshal(body, &ev); err != nil {
		http.Error(w, "not a JSON event", http.StatusBadRequest)
		return
	}
	fmt.Fprintf(rc.out, "%s %s job=%s/%s status=%s webhook-id=%s\n",
		rc.now().UTC().Format(time.RFC3339), ev.Type, ev.Data.Tenant, ev.Data.ID, ev.Data.Status, id)
	w.WriteHeader(http.StatusNoContent)
}

// firstTime records id and reports whether it was new.
func (rc *receiver) firstTime(id string) bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.seen[id] {
		return false
	}
	rc.seen[id] = true
	rc.order = append(rc.order, id)
	if len(rc.order) > seenCap {
		delete(rc.seen, rc.order[0])
		rc.order = rc.order[1:]
	}
	return true
}
