// Package console is llmq's web console (docs/design.md#console): plain
// HTML, CSS and JavaScript embedded in the binary and served at /ui/ by
// the producer, beside the API it calls. It holds no data and no rules of
// its own: the browser keeps the API key the operator logs in with (in
// sessionStorage) and sends it as the API's Authorization header, so what
// a key may read or do is exactly what the API lets it (internal/api,
// roles.go). Nothing is built: the files are served as they are here.
package console

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

//go:embed assets
var assets embed.FS

// Prefix is the path the console is served under.
const Prefix = "/ui/"

// csp lets the console load its own files and talk to its own origin
// only: no inline script, no third-party anything.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"font-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// Handler serves the console's files under Prefix.
func Handler() http.Handler {
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded directory exists at build time
	}
	files := http.StripPrefix(Prefix, http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		// The files change with the binary; a browser revalidates them.
		h.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}

// Mount serves the console under Prefix (and redirects /ui to it) and
// every other request to api.
func Mount(api http.Handler) http.Handler {
	ui := Handler()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == strings.TrimSuffix(Prefix, "/"):
			http.Redirect(w, r, Prefix, http.StatusMovedPermanently)
		case strings.HasPrefix(r.URL.Path, Prefix) && (r.Method == http.MethodGet || r.Method == http.MethodHead):
			ui.ServeHTTP(w, r)
		default:
			api.ServeHTTP(w, r)
		}
	})
}
