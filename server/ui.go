package server

import (
	"embed"
	"io/fs"
	"net/http"
)

// The dashboard's files, built into the binary: the page works on a
// machine without internet and always matches the server it came with.
//
//go:embed ui
var uiFiles embed.FS

// uiCSP lets the page load only its own script and style and talk only to
// this server: whatever a client stored in a buffer or a stream name, the
// page cannot be made to run it or send data elsewhere.
const uiCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// uiHandler serves the dashboard: index.html at / and /ui/, its files
// under /ui/. The files hold no data, so they need no token; the page asks
// for one when the API answers 401.
func uiHandler() handlerFunc {
	sub, err := fs.Sub(uiFiles, "ui")
	if err != nil {
		panic("server: embedded ui: " + err.Error())
	}
	files := http.StripPrefix("/ui/", http.FileServerFS(sub))
	return func(w http.ResponseWriter, r *http.Request) error {
		h := w.Header()
		h.Set("Content-Security-Policy", uiCSP)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		if r.URL.Path == "/" || r.URL.Path == "/ui/" {
			http.ServeFileFS(w, r, sub, "index.html")
			return nil
		}
		if _, err := fs.Stat(sub, r.URL.Path[len("/ui/"):]); err != nil {
			return &apiError{status: http.StatusNotFound, msg: "no such dashboard file: " + r.URL.Path}
		}
		files.ServeHTTP(w, r)
		return nil
	}
}
