// Package browser tests the dashboard in a real browser: Debian's headless
// Chromium, driven by chromedp, against a real `rbd serve` process.
//
//	go test ./tests/browser -v
//
// Chromium comes from Debian's package (`apt-get install -y chromium`;
// .ci/run installs it). Without /usr/bin/chromium (or $RBD_CHROMIUM) the
// tests skip and say so. RBD_BROWSER_SHOTS=DIR keeps the screenshots
// (docs/dashboard.md shows them).
package browser

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/rbdb/rbd/internal/testbin"
)

var rbdBin string

func TestMain(m *testing.M) { testbin.RunWithRbd(m, "RBD_BROWSER_BIN", &rbdBin) }

// chromium returns the browser to drive, or skips the test.
func chromium(t *testing.T) string {
	t.Helper()
	p := os.Getenv("RBD_CHROMIUM")
	if p == "" {
		p = "/usr/bin/chromium"
	}
	if _, err := exec.LookPath(p); err != nil {
		t.Skipf("no Chromium at %s (apt-get install -y chromium, or set RBD_CHROMIUM): %v", p, err)
	}
	return p
}

// page is one browser tab on the dashboard, recording every console error,
// uncaught exception and browser log error (a CSP violation is one).
type page struct {
	t      *testing.T
	ctx    context.Context
	mu     sync.Mutex
	errors []string
}

func newPage(t *testing.T) *page {
	t.Helper()
	// Starting Chromium can fail under load (it did once in a flake hunt).
	// chromedp must not then be asked again on the same context: a second
	// start there closes its allocation channel twice and panics the whole
	// test binary. So each attempt gets a fresh allocator and context.
	for attempt := 1; ; attempt++ {
		p, err := startPage(t)
		if err == nil {
			return p
		}
		if attempt == 3 {
			t.Fatalf("the browser did not start in %d attempts: %v", attempt, err)
		}
		t.Logf("browser start %d failed, trying a fresh one: %v", attempt, err)
	}
}

// startPage starts a browser and its page, and collects the page's
// console errors from then on.
func startPage(t *testing.T) (*page, error) {
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.NoSandbox, // root in CI
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 1000),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	// The whole browser lives at most this long: a test never hangs on it.
	actx, cancelTimeout := context.WithTimeout(actx, 2*time.Minute)
	ctx, cancelCtx := chromedp.NewContext(actx)
	cancel := func() { cancelCtx(); cancelTimeout(); cancelAlloc() }
	// The first action starts the browser, here, before anything else
	// uses the context.
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1400, 1000, chromedp.EmulateScale(1))); err != nil {
		cancel()
		return nil, err
	}
	p := &page{t: t, ctx: ctx}
	messages := chromedp.Console(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.IsException() {
				p.mu.Lock()
				p.errors = append(p.errors, fmt.Sprintf("%s (%s %s:%d)", m, m.Source, m.URL, m.Line))
				p.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return p, nil
}

func (p *page) run(actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	if err := chromedp.Do(p.ctx, actions...); err != nil {
		p.t.Fatalf("browser: %v (page errors so far: %v)", err, p.consoleErrors())
	}
}

func (p *page) consoleErrors() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.errors...)
}

// noErrors fails the test on any console error the page produced.
func (p *page) noErrors() {
	p.t.Helper()
	if errs := p.consoleErrors(); len(errs) > 0 {
		p.t.Errorf("the page logged errors:\n%s", strings.Join(errs, "\n"))
	}
}

// eval returns the value of a JavaScript expression in the page.
func eval[T any](p *page, js string) T {
	p.t.Helper()
	v, err := chromedp.Run(p.ctx, chromedp.Evaluate[T](js))
	if err != nil {
		p.t.Fatalf("evaluate %.80s: %v (page errors so far: %v)", js, err, p.consoleErrors())
	}
	return v
}

// waitJS polls js until it is true.
func (p *page) waitJS(js string) {
	p.t.Helper()
	_, err := chromedp.Run(p.ctx, chromedp.Poll[bool](js, chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(30*time.Second)))
	if err != nil {
		p.t.Fatalf("waiting for %.120s: %v (page errors so far: %v)", js, err, p.consoleErrors())
	}
}

// shot saves a screenshot of the viewport and returns it decoded.
func (p *page) shot(name string) image.Image {
	p.t.Helper()
	buf, err := chromedp.Run(p.ctx, chromedp.CaptureScreenshot())
	if err != nil {
		p.t.Fatalf("screenshot %s: %v", name, err)
	}
	if dir := os.Getenv("RBD_BROWSER_SHOTS"); dir != "" {
		if err := os.WriteFile(filepath.Join(dir, name+".png"), buf, 0o644); err != nil {
			p.t.Fatal(err)
		}
	}
	img, err := png.Decode(bytes.NewReader(buf))
	if err != nil {
		p.t.Fatalf("screenshot %s: %v", name, err)
	}
	return img
}

func serve(t *testing.T, args ...string) *testbin.Server {
	t.Helper()
	srv, err := testbin.StartServer(rbdBin, t.TempDir(), 30*time.Second, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Kill)
	return srv
}

func api(t *testing.T, method, url, token, body string) []byte {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		t.Fatalf("%s %s: %d %s", method, url, resp.StatusCode, b)
	}
	return b
}

// The demo: the overview shows the demo buffer growing, its page has a
// trajectory-length histogram with bars, the collectors page a learning
// curve, and a catch trajectory's filmstrip shows its 84x84 frames pixel
// for pixel.
func TestDashboardDemo(t *testing.T) {
	srv := serve(t, "--demo", "--demo-rate", "2000", "--demo-seed", "7")
	out, err := exec.Command(rbdBin, "collect", "--env", "catch", "--url", srv.URL, "--frames", "512", "--capacity", "2048",
		"--storage", "memory", "--seed", "3").CombinedOutput()
	if err != nil {
		t.Fatalf("rbd collect catch: %v\n%s", err, out)
	}
	p := newPage(t)

	// Overview: the demo buffer's size rises between two looks.
	p.run(chromedp.Navigate(srv.URL + "/"))
	p.waitJS(`document.querySelector('tr[data-buffer="demo"]') !== null && document.querySelector('tr[data-buffer="catch"]') !== null`)
	size1 := eval[float64](p, `Number(document.querySelector('tr[data-buffer="demo"]').dataset.size)`)
	p.waitJS(fmt.Sprintf(`Number(document.querySelector('tr[data-buffer="demo"]').dataset.size) > %v`, size1))
	size2 := eval[float64](p, `Number(document.querySelector('tr[data-buffer="demo"]').dataset.size)`)
	if !(size2 > size1) {
		t.Fatalf("the demo buffer's size went from %v to %v, want a rise", size1, size2)
	}
	p.shot("overview")

	// The buffer page: the length histogram has bars with rows in them,
	// the rate chart a line.
	p.run(chromedp.Navigate(srv.URL + "/#/buffer/demo"))
	p.waitJS(`[...document.querySelectorAll('#lengths svg rect')].some(r => Number(r.dataset.count) > 0)`)
	p.waitJS(`document.querySelector('#rates svg polyline') !== null`)
	bars := eval[int](p, `[...document.querySelectorAll('#lengths svg rect')].filter(r => Number(r.dataset.count) > 0).length`)
	if bars < 2 {
		t.Errorf("%d non-empty trajectory-length bars, want several (CartPole episodes vary in length)", bars)
	}
	p.shot("buffer")

	// Collectors: the demo collector with its learning curve.
	p.run(chromedp.Navigate(srv.URL + "/#/collectors"))
	p.waitJS(`document.querySelector('[data-collector="demo"] #learning-curve svg polyline') !== null`)
	p.shot("collectors")

	// A catch trajectory as a filmstrip: every frame drawn is the stored
	// newest frame of that step, pixel for pixel, in the screenshot.
	var rows struct {
		TrajID      []int64     `json:"traj_id"`
		Observation [][][][]int `json:"observation"` // [n][4][84][84]
	}
	if err := json.Unmarshal(api(t, "GET", srv.URL+"/v1/buffers/catch/rows?from_seq=0&count=1", "", ""), &rows); err != nil {
		t.Fatal(err)
	}
	traj := rows.TrajID[0]
	if err := json.Unmarshal(api(t, "GET", fmt.Sprintf("%s/v1/buffers/catch/rows?traj_id=%d&count=64", srv.URL, traj), "", ""), &rows); err != nil {
		t.Fatal(err)
	}
	p.run(chromedp.Navigate(fmt.Sprintf("%s/#/rows/catch?traj=%d", srv.URL, traj)))
	p.waitJS(`document.querySelectorAll('#filmstrip canvas').length > 0`)
	type box struct{ X, Y, W, H float64 }
	frames := eval[[]box](p, `[...document.querySelectorAll('#filmstrip canvas')].map(c => { const r = c.getBoundingClientRect(); return {X: r.x + c.clientLeft, Y: r.y + c.clientTop, W: c.width, H: c.height}; })`)
	if len(frames) != len(rows.Observation) {
		t.Fatalf("%d frames in the filmstrip, want one per live row of trajectory %d (%d)", len(frames), traj, len(rows.Observation))
	}
	visibleRight := eval[float64](p, `(() => { const s = document.getElementById('filmstrip'); return s.getBoundingClientRect().left + s.clientLeft + s.clientWidth; })()`)
	img := p.shot("filmstrip")
	checked := 0
	for i, f := range frames {
		if f.W != 84 || f.H != 84 {
			t.Fatalf("frame %d is %vx%v, want 84x84", i, f.W, f.H)
		}
		if f.X+84 > visibleRight {
			break // scrolled out of the filmstrip's view
		}
		want := rows.Observation[i][3] // the newest of the 4 stacked frames
		// The canvas sits at a fractional position: take the best of the
		// whole-pixel alignments around it (a wrong picture matches none).
		bad, bright, bx, by := 84*84, 0, 0, 0
		for dy := -1; dy <= 1; dy++ {
			for dx := -1; dx <= 1; dx++ {
				b, br := 0, 0
				for y := range 84 {
					for x := range 84 {
						r, _, _, _ := img.At(int(f.X)+dx+x, int(f.Y)+dy+y).RGBA()
						got := int(r >> 8)
						if d := got - want[y][x]; d > 2 || d < -2 {
							b++
						}
						if got > 200 {
							br++
						}
					}
				}
				if b < bad {
					bad, bright, bx, by = b, br, dx, dy
				}
			}
		}
		if bad > 0 {
			var diffs []string
			for y := range 84 {
				for x := range 84 {
					r, _, _, _ := img.At(int(f.X)+bx+x, int(f.Y)+by+y).RGBA()
					if d := int(r>>8) - want[y][x]; (d > 2 || d < -2) && len(diffs) < 8 {
						diffs = append(diffs, fmt.Sprintf("(%d,%d) shows %d, stored %d", x, y, r>>8, want[y][x]))
					}
				}
			}
			t.Logf("canvas at %+v, best offset %d,%d; first differences: %v", f, bx, by, diffs)
			t.Fatalf("frame %d (step %d): %d of 7056 pixels differ from the stored frame", i, i, bad)
		}
		if bright == 0 {
			t.Fatalf("frame %d has no bright pixel: the ball or the paddle should show", i)
		}
		checked++
	}
	if checked < 3 {
		t.Fatalf("only %d frames were in view to check", checked)
	}
	p.noErrors()
}

// With a token the page asks for it, shows nothing before, and the data
// once it is given.
func TestDashboardToken(t *testing.T) {
	srv := serve(t, "--demo", "--demo-rate", "500", "--token", "s3cret-token")
	p := newPage(t)
	p.run(chromedp.Navigate(srv.URL + "/"))
	p.waitJS(`document.getElementById('token-dialog').open`)
	rows := eval[int](p, `document.querySelectorAll('tr[data-buffer]').length`)
	if rows != 0 {
		t.Fatalf("%d buffers shown before the token was given", rows)
	}
	p.shot("token")
	p.run(chromedp.SendKeys(chromedp.CSS("#token-input"), "wrong-token"), chromedp.Click(chromedp.CSS("#token-form button")))
	p.waitJS(`document.getElementById('token-dialog').open && document.getElementById('token-error').textContent.includes('not accepted')`)
	p.run(chromedp.SendKeys(chromedp.CSS("#token-input"), "s3cret-token"),
		chromedp.Click(chromedp.CSS("#token-form button")))
	p.waitJS(`document.querySelector('tr[data-buffer="demo"]') !== null && !document.getElementById('token-dialog').open`)
	// The wrong token's 401s are expected console noise of the browser's
	// network log, not errors of the page.
	for _, e := range p.consoleErrors() {
		if !strings.Contains(e, "401") {
			t.Errorf("page error: %s", e)
		}
	}
}

// Whatever a client stores in names and messages reaches the page as text:
// markup in a stream name or an error message neither runs nor renders.
func TestDashboardEscapes(t *testing.T) {
	srv := serve(t)
	spec := `{"capacity": 100, "storage": "memory", "fields": {"observation": {"dtype": "float32", "shape": [2]}, "next.done": {"dtype": "bool"}}}`
	api(t, "PUT", srv.URL+"/v1/buffers/x", "", spec)
	stream := `<img src=x onerror="window.__pwned=1">`
	api(t, "POST", srv.URL+"/v1/buffers/x/extend?stream="+url.QueryEscape(stream), "", `{"observation": [[1,2]], "next.done": [false]}`)
	field := `<script>window.__pwned=2</script>`
	req, _ := http.NewRequest("POST", srv.URL+"/v1/buffers/x/extend", strings.NewReader(`{"`+field+`": [1]}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Fatalf("a bad extend answered %d, want 400", resp.StatusCode)
	}

	p := newPage(t)
	p.run(chromedp.Navigate(srv.URL + "/#/buffer/x"))
	p.waitJS(`document.querySelector('#streams .stream') !== null && document.querySelector('#errors .message') !== null`)
	type shown struct {
		Stream, Message string
		Markup          int
		Pwned           bool
	}
	got := eval[shown](p, `({Stream: document.querySelector('#streams .stream').textContent,
	  Message: document.querySelector('#errors .message').textContent,
	  Markup: document.querySelectorAll('main img, main script').length,
	  Pwned: window.__pwned !== undefined})`)
	if got.Stream != stream || !strings.Contains(got.Message, field) || got.Markup != 0 || got.Pwned {
		t.Fatalf("page shows stream %q, message %q, %d img/script elements, pwned %v; want the literal text and no markup",
			got.Stream, got.Message, got.Markup, got.Pwned)
	}
	p.shot("escapes")
	p.noErrors()
}

// 100 buffers: the overview lists them all and keeps refreshing. How long
// a render takes is logged (a measurement, not asserted).
func TestDashboardManyBuffers(t *testing.T) {
	srv := serve(t)
	spec := `{"capacity": 1000, "storage": "memory", "fields": {"observation": {"dtype": "float32", "shape": [4]}, "next.done": {"dtype": "bool"}}}`
	for i := range 100 {
		url := fmt.Sprintf("%s/v1/buffers/b%03d", srv.URL, i)
		api(t, "PUT", url, "", spec)
		api(t, "POST", url+"/extend", "", `{"observation": [[1,2,3,4],[1,2,3,4]], "next.done": [false,true]}`)
	}
	p := newPage(t)
	start := time.Now()
	p.run(chromedp.Navigate(srv.URL + "/"))
	p.waitJS(`document.querySelectorAll('#buffers tbody tr').length === 100`)
	first := time.Since(start)
	// The page's own figure: requests and drawing of its last refresh.
	var ms []float64
	for range 5 {
		stamp := eval[string](p, `document.getElementById('status').textContent`)
		p.waitJS(fmt.Sprintf(`document.getElementById('status').textContent !== %q`, stamp))
		ms = append(ms, eval[float64](p, `Number(document.getElementById('status').dataset.refreshMs)`))
	}
	t.Logf("100 buffers: first full table %v after navigation (page load, 2 API calls, render); refreshes took %v ms",
		first.Round(time.Millisecond), ms)
	p.noErrors()
}
