package api_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io/fs"
	"maps"
	"mime"
	"net/http"
	"net/url"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	spec "github.com/llmq/llmq/api"
	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// contract records every answer the API's handlers give while the
// package's tests run, named by the registered pattern that served it
// (the server's own table, api.RoutePatterns), for contractRun to hold to
// api/openapi.yaml once they are done. Every server the tests start is
// served through contract.record (newTestServer, the fuzz target).
var contract = &recorder{seen: map[routeStatus]int{}, bodies: map[routeStatus][]answer{}}

// bodiesPerStatus bounds the bodies kept for validation per route and
// status (a fuzz run answers millions).
const bodiesPerStatus = 25

type routeStatus struct {
	pattern string // "METHOD /path" as registered, or "/"
	status  int
}

func (rs routeStatus) String() string { return fmt.Sprintf("%s %d", rs.pattern, rs.status) }

// answer is one recorded response.
type answer struct {
	request     string // method and path, for the failure message
	contentType string
	header      http.Header
	body        []byte
}

type recorder struct {
	once       sync.Once
	registered []string       // the server's patterns (api.RoutePatterns)
	match      *http.ServeMux // the same patterns, to name a request's route

	mu     sync.Mutex
	seen   map[routeStatus]int
	bodies map[routeStatus][]answer
}

// record returns srv's handler, recording its answers.
func (c *recorder) record(srv *api.Server) http.Handler {
	c.once.Do(func() {
		c.registered = api.RoutePatterns(srv)
		c.match = http.NewServeMux()
		for _, p := range c.registered {
			c.match.Handle(p, http.NotFoundHandler())
		}
	})
	h := srv.Handler()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, pattern := c.match.Handler(r)
		cw := &captureWriter{ResponseWriter: w}
		h.ServeHTTP(cw, r)
		if cw.code == 0 && r.Context().Err() != nil {
			return // the client left before any answer (a long-poll it gave up): nothing was answered
		}
		c.add(routeStatus{pattern: pattern, status: cw.status()},
			answer{request: r.Method + " " + r.URL.Path, contentType: w.Header().Get("Content-Type"), header: w.Header().Clone(), body: cw.body.Bytes()})
	})
}

func (c *recorder) add(rs routeStatus, a answer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen[rs]++
	if len(c.bodies[rs]) < bodiesPerStatus {
		c.bodies[rs] = append(c.bodies[rs], a)
	}
}

// captureWriter keeps the status and body a handler writes.
type captureWriter struct {
	http.ResponseWriter
	code int
	body bytes.Buffer
}

func (w *captureWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *captureWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	w.body.Write(b)
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController flush a stream through the capture.
func (w *captureWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *captureWriter) status() int {
	if w.code == 0 {
		return http.StatusOK
	}
	return w.code
}

// contractRun is the package's testing.M: after the tests pass it checks
// what contract recorded against api/openapi.yaml, and fails the run with
// one line per disagreement, naming the route and status:
//   - every (route, status) a handler answered is described, and its body
//     has a described content type and matches the described schema;
//   - when every test ran (no -run, -skip, -list or fuzzing), every
//     described (route, status) was answered by some test, unless the
//     response says why none can with x-llmq-untested.
type contractRun struct{ m *testing.M }

func (r contractRun) Run() int {
	code := r.m.Run()
	if code != 0 {
		return code
	}
	doc, err := loadOpenAPI(spec.OpenAPI())
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: api/openapi.yaml:", err)
		return 1
	}
	if problems := contract.check(doc, fullRun()); len(problems) > 0 {
		fmt.Fprintln(os.Stderr, "FAIL: the API's handlers and api/openapi.yaml disagree (see internal/api/contract_test.go):")
		for _, p := range problems {
			fmt.Fprintln(os.Stderr, "    "+p)
		}
		return 1
	}
	return 0
}

// fullRun reports whether the run ran every test of the package, so that
// a described status nobody provoked means no test can.
func fullRun() bool {
	for _, name := range []string{"test.run", "test.skip", "test.list", "test.fuzz"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" {
			return false
		}
	}
	if f := flag.Lookup("test.fuzzworker"); f != nil && f.Value.String() == "true" {
		return false
	}
	return true
}

// loadOpenAPI loads and validates an OpenAPI document (spec.OpenAPI(),
// or a test's variant of it), its references resolved within package
// api's files.
func loadOpenAPI(data []byte) (*openapi3.T, error) {
	loader := openapi3.NewLoader()
	loader.IsExternalRefsAllowed = true
	loader.ReadFromURIFunc = func(_ *openapi3.Loader, u *url.URL) ([]byte, error) {
		return fs.ReadFile(spec.FS(), strings.TrimPrefix(path.Clean(u.Path), "/"))
	}
	doc, err := loader.LoadFromDataWithPath(data, &url.URL{Path: spec.OpenAPIFile})
	if err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		return nil, fmt.Errorf("validate: %w", err)
	}
	return doc, nil
}

// operation returns the document's operation for a registered pattern.
func operation(doc *openapi3.T, pattern string) *openapi3.Operation {
	method, p, ok := strings.Cut(pattern, " ")
	if !ok {
		return nil
	}
	item := doc.Paths.Value(p)
	if item == nil {
		return nil
	}
	return item.GetOperation(method)
}

// catchAll is the server's pattern for every unregistered request, which
// OpenAPI cannot name as a path: the document lists its responses under
// x-llmq-unmatched, by status, as names of components/responses.
const catchAll = "/"

// described returns the responses the document gives pattern, by status.
func described(doc *openapi3.T, pattern string) map[string]*openapi3.ResponseRef {
	if pattern == catchAll {
		ext, _ := doc.Extensions["x-llmq-unmatched"].(map[string]any)
		byStatus, _ := ext["responses"].(map[string]any)
		out := map[string]*openapi3.ResponseRef{}
		for status, name := range byStatus {
			if ref := doc.Components.Responses[fmt.Sprint(name)]; ref != nil {
				out[status] = ref
			}
		}
		return out
	}
	if op := operation(doc, pattern); op != nil && op.Responses != nil {
		return op.Responses.Map()
	}
	return nil
}

// untested returns the reason a described response gives for having no
// test (x-llmq-untested, on the response or its reference).
func untested(ref *openapi3.ResponseRef) string {
	for _, ext := range []map[string]any{ref.Extensions, ref.Value.Extensions} {
		if why, ok := ext["x-llmq-untested"].(string); ok {
			return why
		}
	}
	return ""
}

func (c *recorder) check(doc *openapi3.T, complete bool) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var problems []string
	var observed []routeStatus
	for rs := range c.seen {
		observed = append(observed, rs)
	}
	slices.SortFunc(observed, func(a, b routeStatus) int { return strings.Compare(a.String(), b.String()) })
	for _, rs := range observed {
		ref := described(doc, rs.pattern)[strconv.Itoa(rs.status)]
		if ref == nil {
			problems = append(problems, fmt.Sprintf("%s: a handler answered it (%s) but api/openapi.yaml does not describe it", rs, c.bodies[rs][0].request))
			continue
		}
		if why := untested(ref); why != "" {
			problems = append(problems, fmt.Sprintf("%s: a test provoked it, so drop its x-llmq-untested (%q)", rs, why))
		}
		problems = append(problems, checkAnswers(rs, ref.Value, c.bodies[rs])...)
	}
	if !complete {
		return problems
	}
	if len(c.registered) == 0 {
		return append(problems, "no test served the API through contract.record")
	}
	for _, pattern := range c.registered {
		responses := described(doc, pattern)
		for _, status := range slices.Sorted(maps.Keys(responses)) {
			ref := responses[status]
			code, err := strconv.Atoi(status)
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s %s: describe statuses by number, not %q", pattern, status, status))
				continue
			}
			rs := routeStatus{pattern: pattern, status: code}
			if c.seen[rs] == 0 && untested(ref) == "" {
				problems = append(problems, fmt.Sprintf("%s: api/openapi.yaml describes it but no test got it from the handler: provoke it in a test, or give the response x-llmq-untested: <why no test can>", rs))
			}
		}
	}
	return problems
}

// checkAnswers holds the recorded answers of one route and status to
// their description: the headers it requires, a content type it lists,
// and a JSON body its schema takes.
func checkAnswers(rs routeStatus, resp *openapi3.Response, answers []answer) []string {
	var problems []string
	for _, a := range answers {
		for _, name := range slices.Sorted(maps.Keys(resp.Headers)) {
			if resp.Headers[name].Value.Required && a.header.Get(name) == "" {
				problems = append(problems, fmt.Sprintf("%s: %s answered without the header %s, which api/openapi.yaml requires", rs, a.request, name))
			}
		}
		mt, _, err := mime.ParseMediaType(a.contentType)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %s answered Content-Type %q: %v", rs, a.request, a.contentType, err))
			continue
		}
		media := resp.Content.Get(mt)
		if media == nil {
			problems = append(problems, fmt.Sprintf("%s: %s answered Content-Type %s, which api/openapi.yaml does not list", rs, a.request, mt))
			continue
		}
		if mt != "application/json" || media.Schema == nil {
			continue
		}
		var v any
		if err := json.Unmarshal(a.body, &v); err != nil {
			problems = append(problems, fmt.Sprintf("%s: %s answered a body that is not JSON: %v", rs, a.request, err))
			continue
		}
		if err := media.Schema.Value.VisitJSON(v, openapi3.EnableJSONSchema2020()); err != nil {
			// The validator appends the schema and the value; the body says both.
			why, _, _ := strings.Cut(err.Error(), "\nSchema:")
			problems = append(problems, fmt.Sprintf("%s: the body %s answered does not match api/openapi.yaml: %s\n        body: %s", rs, a.request, why, excerpt(a.body)))
		}
	}
	return problems
}

func excerpt(b []byte) string {
	const max = 400
	b = bytes.TrimSpace(b)
	if len(b) > max {
		return string(b[:max]) + "…"
	}
	return string(b)
}

// TestContractCheck shows, on a recorder of its own, what the check after
// the run reports: a status a handler answered that the document does not
// describe, a body off its schema, a described status no test provoked,
// and the x-llmq-untested mark that excuses one (and must go once a test
// provokes it).
func TestContractCheck(t *testing.T) {
	t.Parallel()
	srv, err := api.New(api.Config{Store: &fakeStore{jobs: map[job.Key]store.Record{}}, Publisher: &lastPublisher{}, Inspector: zeroInspector{}})
	require.NoError(t, err)
	fresh := func() *recorder {
		r := &recorder{seen: map[routeStatus]int{}, bodies: map[routeStatus][]answer{}}
		r.registered = api.RoutePatterns(srv)
		return r
	}
	jsonAnswer := func(req, body string) answer {
		return answer{request: req, contentType: "application/json", body: []byte(body)}
	}
	doc, err := loadOpenAPI(spec.OpenAPI())
	require.NoError(t, err)

	r := fresh()
	r.add(routeStatus{"GET /v1/jobs/{id}", http.StatusTeapot}, jsonAnswer("GET /v1/jobs/x", `{}`))
	r.add(routeStatus{"GET /healthz", http.StatusOK}, jsonAnswer("GET /healthz", `{"status":"ok","version":"1"}`))
	r.add(routeStatus{"GET /v1/status", http.StatusUnauthorized}, answer{request: "GET /v1/status", contentType: "text/html", body: []byte("no")})
	r.add(routeStatus{"POST /v1/jobs", http.StatusTooManyRequests}, jsonAnswer("POST /v1/jobs", `{"error":{"code":"backpressure","message":"full"},"backlog":3}`))
	problems := strings.Join(r.check(doc, false), "\n")
	assert.Contains(t, problems, "GET /v1/jobs/{id} 418: a handler answered it (GET /v1/jobs/x) but api/openapi.yaml does not describe it")
	assert.Contains(t, problems, "GET /healthz 200: the body GET /healthz answered does not match api/openapi.yaml")
	assert.Contains(t, problems, "GET /v1/status 401: GET /v1/status answered Content-Type text/html, which api/openapi.yaml does not list")
	assert.Contains(t, problems, "POST /v1/jobs 429: POST /v1/jobs answered without the header Retry-After, which api/openapi.yaml requires")
	assert.NotContains(t, problems, "no test got it", "a partial run does not ask for every status")

	problems = strings.Join(fresh().check(doc, true), "\n")
	assert.Contains(t, problems, "POST /v1/jobs 503: api/openapi.yaml describes it but no test got it from the handler")
	assert.Contains(t, problems, "/ 404: api/openapi.yaml describes it but no test got it", "the catch-all's x-llmq-unmatched")

	const ref = `        "503":
          $ref: "#/components/responses/SubmitUnavailable"
`
	marked := strings.Replace(string(spec.OpenAPI()), ref, ref+"          x-llmq-untested: a test cannot make Postgres fail between two statements\n", 1)
	require.NotEqual(t, string(spec.OpenAPI()), marked)
	doc, err = loadOpenAPI([]byte(marked))
	require.NoError(t, err)
	problems = strings.Join(fresh().check(doc, true), "\n")
	assert.NotContains(t, problems, "POST /v1/jobs 503")
	r = fresh()
	r.add(routeStatus{"POST /v1/jobs", http.StatusServiceUnavailable}, jsonAnswer("POST /v1/jobs",
		`{"error":{"code":"store_unavailable","message":"down"},"id":"j-1"}`))
	assert.Contains(t, strings.Join(r.check(doc, false), "\n"), `POST /v1/jobs 503: a test provoked it, so drop its x-llmq-untested ("a test cannot make Postgres fail between two statements")`)
}
