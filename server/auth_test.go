package server

import (
	"errors"
	"net/http"
	"strings"
	"testing"
)

const (
	tokRead  = "read-token-0123456789"
	tokWrite = "write-token-0123456789"
	tokAdmin = "admin-token-0123456789"
)

const tokenFile = `# roles of the test server
read  ` + tokRead + `

write ` + tokWrite + `
admin ` + tokAdmin + `
`

// TestRoleRouteTable sends a request to every route with no token, an
// unknown one, and a token of each role: a route answers 401 without a
// known token and 403 to a role below the one it needs, and lets every
// role at or above it through. It fails when a route of endpointRoles has
// no case here.
func TestRoleRouteTable(t *testing.T) {
	tokens, err := ParseTokenFile([]byte(tokenFile))
	if err != nil {
		t.Fatal(err)
	}
	ts, _ := newTestServer(t, &Options{Tokens: tokens, Pprof: true, CheckpointRoot: t.TempDir(), Weights: nopWeights{}})
	for _, tok := range []string{tokAdmin} {
		if code, body := do(t, "PUT", ts.URL+"/v1/buffers/cp", "application/json", cartpoleSpec, "Authorization", "Bearer "+tok); code != 201 {
			t.Fatalf("create: %d %s", code, body)
		}
	}
	rows := `{"observation": [[1,2,3,4]], "action": [1], "next.reward": [1], "next.done": [false], "next.terminated": [false], "next.truncated": [false]}`
	cases := []struct {
		endpoint, method, path, body string
	}{
		{"health", "GET", "/v1/health", ""},
		{"metrics", "GET", "/metrics", ""},
		{"list", "GET", "/v1/buffers", ""},
		{"info", "GET", "/v1/buffers/cp", ""},
		{"rows", "GET", "/v1/buffers/cp/rows", ""},
		{"sample", "POST", "/v1/buffers/cp/sample", `{"batch_size": 1, "include_incomplete": true}`},
		{"not_found", "GET", "/v1/nothing", ""},
		{"extend", "POST", "/v1/buffers/cp/extend?stream=s", rows},
		{"priorities", "POST", "/v1/buffers/cp/priorities", `{"seq": [0], "priority": [1]}`},
		{"update", "POST", "/v1/buffers/cp/update", `{"seq": [0], "observation": [[1,2,3,4]]}`},
		{"close_stream", "DELETE", "/v1/buffers/cp/streams/s", ""},
		{"weights", "PUT", "/v1/collectors/demo/weights", ""},
		{"collector", "GET", "/v1/collectors/demo", ""},
		{"collectors", "GET", "/v1/collectors", ""},
		{"activity", "GET", "/v1/activity", ""},
		{"stats", "GET", "/v1/buffers/cp/stats", ""},
		{"ui", "GET", "/", ""},
		{"ui", "GET", "/ui/app.js", ""},
		{"create", "PUT", "/v1/buffers/other", cartpoleSpec},
		{"checkpoint", "POST", "/v1/buffers/cp/checkpoint", `{"dir": "x"}`},
		{"rate_limit", "PUT", "/v1/buffers/cp/rate_limit", `{"min_size": 1}`},
		{"pprof", "GET", "/debug/pprof/", ""},
		{"delete", "DELETE", "/v1/buffers/other", ""},
	}
	covered := map[string]bool{}
	for _, c := range cases {
		covered[c.endpoint] = true
		need := endpointRoles[c.endpoint]
		for _, who := range []struct {
			role Role
			tok  string
		}{{RoleNone, ""}, {RoleNone, "unknown-token-0123456789"}, {RoleRead, tokRead}, {RoleWrite, tokWrite}, {RoleAdmin, tokAdmin}} {
			var hdr []string
			if who.tok != "" {
				hdr = []string{"Authorization", "Bearer " + who.tok}
			}
			code, body := do(t, c.method, ts.URL+c.path, "application/json", c.body, hdr...)
			switch {
			case need == RoleNone:
				if code == 401 || code == 403 {
					t.Errorf("%s as %s: %d; it needs no token", c.endpoint, who.role, code)
				}
			case who.role == RoleNone:
				if code != 401 {
					t.Errorf("%s with token %q: %d, want 401", c.endpoint, who.tok, code)
				}
			case who.role < need:
				if code != 403 || !strings.Contains(string(body), "needs "+need.String()) {
					t.Errorf("%s as %s: %d %s, want 403 naming %s", c.endpoint, who.role, code, body, need)
				}
			default:
				if code == 401 || code == 403 {
					t.Errorf("%s as %s: %d %s; the role is enough", c.endpoint, who.role, code, body)
				}
			}
		}
	}
	for ep := range endpointRoles {
		if !covered[ep] {
			t.Errorf("endpoint %q has no case in this table", ep)
		}
	}
}

type nopWeights struct{}

func (nopWeights) SetWeights(string, map[string][]float32, map[string][]int) error { return nil }

// TestEveryRouteHasARole: registering an endpoint without a role panics.
func TestEveryRouteHasARole(t *testing.T) {
	s := &Server{}
	defer func() {
		if recover() == nil {
			t.Fatal("an endpoint without a role was registered")
		}
	}()
	s.wrap("no_such_endpoint", http.NotFoundHandler())
}

func TestParseTokenFile(t *testing.T) {
	secret := "s3cr3t-s3cr3t-s3cr3t"
	for _, c := range []struct {
		name, file string
		want       string // error substring; "" for success
	}{
		{"ok", tokenFile, ""},
		{"comments only", "# nothing\n\n", "no tokens"},
		{"unknown role", "root " + secret + "\n", "line 1: unknown role"},
		{"three words", "read " + secret + " extra\n", "line 1: want \"ROLE TOKEN\""},
		{"one word", "\n\n" + secret + "\n", "line 3:"},
		{"short token", "read short\n", "line 1: the token is 5 characters long"},
		{"two roles", "read " + secret + "\nadmin " + secret + "\n", "line 2: a token given twice with different roles"},
		{"same twice", "read " + secret + "\nread " + secret + "\n", ""},
		{"non-ASCII", "read " + secret + "é\n", "printable ASCII"},
		{"CRLF", "read " + secret + "\r\n", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			tokens, err := ParseTokenFile([]byte(c.file))
			switch {
			case c.want == "" && err != nil:
				t.Fatal(err)
			case c.want == "" && tokens.Len() == 0:
				t.Fatal("no tokens")
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, ErrTokenFile)):
				t.Fatalf("error %v, want one containing %q", err, c.want)
			case err != nil && strings.Contains(err.Error(), secret[:8]):
				t.Fatalf("the error repeats the token: %v", err)
			}
		})
	}
}

// go test ./server -run '^$' -fuzz FuzzParseTokenFile -fuzztime 60s
//
// The parser never panics, never puts a line's token in its error, and
// every token it accepts is found with its role.
func FuzzParseTokenFile(f *testing.F) {
	f.Add([]byte(tokenFile))
	f.Add([]byte("read aaaaaaaaaaaaaaaa\nwrite bbbbbbbbbbbbbbbb\n# c\n"))
	f.Add([]byte("admin \x00\x01\x02aaaaaaaaaaaaaaaaaaaa"))
	f.Add([]byte("read 0123456789abcdef extra"))
	f.Fuzz(func(t *testing.T, data []byte) {
		tokens, err := ParseTokenFile(data)
		if err != nil {
			for _, line := range strings.Split(string(data), "\n") {
				for _, w := range strings.Fields(line) {
					if len(w) >= minTokenLen && w != "read" && strings.Contains(err.Error(), w) {
						t.Fatalf("the error %q repeats %q", err, w)
					}
				}
			}
			return
		}
		for _, line := range strings.Split(string(data), "\n") {
			f := strings.Fields(strings.TrimSpace(line))
			if len(f) == 2 && !strings.HasPrefix(f[0], "#") {
				want := map[string]Role{"read": RoleRead, "write": RoleWrite, "admin": RoleAdmin}[f[0]]
				if got := tokens.role(f[1]); got != want {
					t.Fatalf("token of line %q has role %s, want %s", line, got, want)
				}
			}
		}
	})
}
