// Package security runs a real `rbd serve` with TLS, mutual TLS and role
// tokens: HTTPS with a CA made by the test, handshakes that must fail,
// certificate and token rotation by SIGHUP (and by a file change) while
// writers and samplers run, and a search of the whole log for every token.
package security

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rbdb/rbd/client"
	"github.com/rbdb/rbd/internal/loadgen"
	"github.com/rbdb/rbd/internal/testbin"
)

var rbdBin string

func TestMain(m *testing.M) { testbin.RunWithRbd(m, "RBD_SECURITY_BIN", &rbdBin) }

// Tokens of the tests: 16+ characters, distinct enough to grep for.
const (
	tokRead  = "tok-read-5b1e9c0f3a"
	tokWrite = "tok-write-77d2a94e10"
	tokAdmin = "tok-admin-c3f08e6b2d"
	tokNew   = "tok-read-new-9e4c71a0"
	tokWrong = "tok-unknown-1f0e2d3c4b"
)

type pki struct {
	http    *http.Client // trusts the CA
	dir     string
	ca      *testbin.CA
	serial  *big.Int // of the server certificate in the files now
	caFile  string
	tokFile string
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	ca, err := testbin.NewCA("rbd test CA")
	if err != nil {
		t.Fatal(err)
	}
	p := &pki{dir: t.TempDir(), ca: ca}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CertPEM)
	p.http = &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	p.caFile = filepath.Join(p.dir, "ca.crt")
	p.tokFile = filepath.Join(p.dir, "tokens")
	p.rotateServerCert(t)
	if err := testbin.WriteFiles(p.dir, map[string][]byte{
		"ca.crt": ca.CertPEM,
		"tokens": []byte("read " + tokRead + "\nwrite " + tokWrite + "\nadmin " + tokAdmin + "\n"),
	}); err != nil {
		t.Fatal(err)
	}
	return p
}

// rotateServerCert writes a new server certificate and key (tls.crt,
// tls.key, as cert-manager names them).
func (p *pki) rotateServerCert(t *testing.T) {
	t.Helper()
	certPEM, keyPEM, serial, err := p.ca.Issue("rbd server", false)
	if err != nil {
		t.Fatal(err)
	}
	if err := testbin.WriteFiles(p.dir, map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM}); err != nil {
		t.Fatal(err)
	}
	p.serial = serial
}

func (p *pki) serve(t *testing.T, extra ...string) *testbin.Server {
	t.Helper()
	args := append([]string{"--tls-cert", filepath.Join(p.dir, "tls.crt"), "--tls-key", filepath.Join(p.dir, "tls.key"),
		"--token-file", p.tokFile}, extra...)
	srv, err := testbin.StartServer(rbdBin, filepath.Join(t.TempDir(), "data"), time.Minute, args...)
	if err != nil {
		t.Fatal(err)
	}
	srv.URL = "https://" + strings.TrimPrefix(srv.URL, "http://")
	t.Cleanup(func() {
		if !srv.Exited() {
			srv.Kill()
		}
		if t.Failed() {
			t.Logf("server log:\n%s", srv.Stderr.String())
		}
	})
	return srv
}

func (p *pki) client(t *testing.T, url, token string, extra ...string) *client.Client {
	t.Helper()
	o := &client.Options{Token: token, CAFile: p.caFile}
	if len(extra) == 2 {
		o.CertFile, o.KeyFile = extra[0], extra[1]
	}
	c, err := client.New(url, o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}

// serverSerial does a TLS handshake and returns the serial number of the
// certificate the server presented.
func serverSerial(t *testing.T, p *pki, url string) *big.Int {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(p.ca.CertPEM)
	conn, err := tls.Dial("tcp", strings.TrimPrefix(url, "https://"), &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber
}

// TestHTTPS: the API over TLS with the test's CA; a client that does not
// trust the CA, and plain HTTP to the TLS port, get nothing from it.
func TestHTTPS(t *testing.T) {
	p := newPKI(t)
	srv := p.serve(t)
	c := p.client(t, srv.URL, tokAdmin)
	if err := c.Health(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.CreateBufferJSON(ctx(t), "b", loadgen.Spec(1000, "memory", "")); err != nil {
		t.Fatal(err)
	}
	// A client with the system's CAs only: the handshake fails.
	plain, _ := client.New(srv.URL, &client.Options{Token: tokAdmin})
	var uae x509.UnknownAuthorityError
	if err := plain.Health(ctx(t)); err == nil || !errors.As(err, &uae) {
		t.Fatalf("a client that does not trust the CA: %v, want an unknown authority error", err)
	}
	// Plain HTTP to the TLS port: no API answer (net/http says, in plain
	// text, that this is an HTTPS server).
	resp, err := http.Get("http://" + strings.TrimPrefix(srv.URL, "https://") + "/v1/buffers")
	if err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || strings.Contains(string(body), `"buffers"`) {
			t.Fatalf("plain HTTP to the TLS port: %d %q", resp.StatusCode, body)
		}
	}
	if !strings.Contains(srv.Stderr.String(), `"addr":"https://`) {
		t.Error("the serving log line does not say https")
	}
}

// TestMutualTLS: with --tls-client-ca, no client certificate or one from
// another CA fails the handshake; one from the CA gets in.
func TestMutualTLS(t *testing.T) {
	p := newPKI(t)
	srv := p.serve(t, "--tls-client-ca", p.caFile)
	good, goodKey, _, err := p.ca.Issue("learner", true)
	if err != nil {
		t.Fatal(err)
	}
	other, err := testbin.NewCA("another CA")
	if err != nil {
		t.Fatal(err)
	}
	bad, badKey, _, err := other.Issue("intruder", true)
	if err != nil {
		t.Fatal(err)
	}
	if err := testbin.WriteFiles(p.dir, map[string][]byte{"good.crt": good, "good.key": goodKey, "bad.crt": bad, "bad.key": badKey}); err != nil {
		t.Fatal(err)
	}
	f := func(n string) string { return filepath.Join(p.dir, n) }
	if err := p.client(t, srv.URL, tokRead).Health(ctx(t)); err == nil {
		t.Fatal("no client certificate: the handshake succeeded")
	}
	if err := p.client(t, srv.URL, tokRead, f("bad.crt"), f("bad.key")).Health(ctx(t)); err == nil {
		t.Fatal("a client certificate from another CA: the handshake succeeded")
	}
	c := p.client(t, srv.URL, tokRead, f("good.crt"), f("good.key"))
	if _, err := c.Buffers(ctx(t)); err != nil {
		t.Fatalf("a client certificate from the CA: %v", err)
	}
}

// TestRotationUnderLoad replaces the certificate and the token file while
// writers and samplers run, with SIGHUP and then by a change of the files
// alone: no request fails because of it, new handshakes get the new
// certificate, a removed token stops working and an added one starts. A
// bad new pair keeps the old one. Then the whole log is searched for every
// token the test used.
func TestRotationUnderLoad(t *testing.T) {
	p := newPKI(t)
	srv := p.serve(t)
	admin := p.client(t, srv.URL, tokAdmin)
	if _, _, err := admin.CreateBufferJSON(ctx(t), "b", loadgen.Spec(20000, "memmap", "")); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	var ops atomic.Int64
	var failures []error
	var mu sync.Mutex
	fail := func(err error) {
		mu.Lock()
		failures = append(failures, err)
		mu.Unlock()
	}
	wg.Go(func() {
		for i := int64(0); !stop.Load(); i += 32 {
			if err := p.extend(srv, tokWrite, loadgen.Body(loadgen.Token(1, i), 32)); err != nil {
				fail(fmt.Errorf("writer: %w", err))
				return
			}
			ops.Add(1)
		}
	})
	for range 2 {
		wg.Go(func() {
			c := p.client(t, srv.URL, tokWrite)
			for !stop.Load() {
				if _, err := c.Sample(context.Background(), "b", &client.SampleRequest{BatchSize: 16, TimeoutMS: 1000}); err != nil {
					fail(fmt.Errorf("sampler: %w", err))
					return
				}
				ops.Add(1)
			}
		})
	}
	waitLog := func(what string, n int) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); strings.Count(srv.Stderr.String(), what) < n; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no %d log lines %q after 30s", n, what)
			}
		}
	}
	time.Sleep(300 * time.Millisecond)
	first := p.serial
	if got := serverSerial(t, p, srv.URL); got.Cmp(first) != 0 {
		t.Fatalf("serial %v, want %v", got, first)
	}
	// 1. SIGHUP after new files: new certificate, tokRead out, tokNew in.
	p.rotateServerCert(t)
	if err := testbin.WriteFiles(p.dir, map[string][]byte{"tokens": []byte("read " + tokNew + "\nwrite " + tokWrite + "\nadmin " + tokAdmin + "\n")}); err != nil {
		t.Fatal(err)
	}
	srv.Cmd.Process.Signal(syscall.SIGHUP)
	waitLog("TLS certificate reloaded", 1)
	waitLog("tokens reloaded", 1)
	if got := serverSerial(t, p, srv.URL); got.Cmp(p.serial) != 0 {
		t.Fatalf("after SIGHUP: serial %v, want the new %v", got, p.serial)
	}
	if _, err := p.client(t, srv.URL, tokRead).Buffers(ctx(t)); !errors.Is(err, client.ErrUnauthorized) {
		t.Fatalf("the removed token after SIGHUP: %v, want 401", err)
	}
	if _, err := p.client(t, srv.URL, tokNew).Buffers(ctx(t)); err != nil {
		t.Fatalf("the added token after SIGHUP: %v", err)
	}
	if _, err := p.client(t, srv.URL, tokNew).Extend(ctx(t), "b", "x", nil); !isStatus(err, 403) {
		t.Fatalf("a read token extending: %v, want 403", err)
	}
	// 2. A bad new pair: kept out, the server goes on with the old one.
	if err := testbin.WriteFiles(p.dir, map[string][]byte{"tls.crt": []byte("not a certificate")}); err != nil {
		t.Fatal(err)
	}
	srv.Cmd.Process.Signal(syscall.SIGHUP)
	waitLog("TLS certificate not reloaded", 1)
	if got := serverSerial(t, p, srv.URL); got.Cmp(p.serial) != 0 {
		t.Fatalf("after a bad pair: serial %v, want the one before %v", got, p.serial)
	}
	// 3. No signal: a rotation in place (as a Secret mount does) is
	// picked up by the poll.
	p.rotateServerCert(t)
	waitLog("TLS certificate reloaded", 2)
	if got := serverSerial(t, p, srv.URL); got.Cmp(p.serial) != 0 {
		t.Fatalf("after a rotation in place: serial %v, want %v", got, p.serial)
	}
	time.Sleep(300 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	for _, err := range failures {
		t.Error(err)
	}
	t.Logf("%d requests of writers and samplers across three rotations", ops.Load())
	if ops.Load() < 10 {
		t.Fatalf("only %d requests", ops.Load())
	}
	// A token the server never knew, sent too.
	p.client(t, srv.URL, tokWrong).Buffers(ctx(t))
	if code, err := srv.Stop(syscall.SIGTERM, time.Minute); err != nil || code != 0 {
		t.Fatalf("SIGTERM: %d %v", code, err)
	}
	log := srv.Stderr.String()
	for _, tok := range []string{tokRead, tokWrite, tokAdmin, tokNew, tokWrong} {
		if strings.Contains(log, tok) {
			t.Errorf("the log holds token %q", tok)
		}
	}
}

func isStatus(err error, status int) bool {
	var ae *client.APIError
	return errors.As(err, &ae) && ae.Status == status
}

// extend sends a safetensors extend body (loadgen rows) to buffer "b".
func (p *pki) extend(srv *testbin.Server, token string, body []byte) error {
	req, err := http.NewRequest("POST", srv.URL+"/v1/buffers/b/extend?stream=w", strings.NewReader(string(body)))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := p.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != 200 {
		return fmt.Errorf("extend: %d", resp.StatusCode)
	}
	return nil
}

// TestClearTextWarning: tokens on a non-loopback address without TLS are
// said to travel in clear text, at start.
func TestClearTextWarning(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(rbdBin, "serve", "--addr", "0.0.0.0:0", "--addr-file", filepath.Join(dir, "addr"), "--data", filepath.Join(dir, "d"), "--token", tokAdmin)
	var out strings.Builder
	cmd.Stderr = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(dir, "addr")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no addr file")
		}
	}
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	if !strings.Contains(out.String(), "clear text") || strings.Contains(out.String(), tokAdmin) {
		t.Fatalf("log:\n%s", out.String())
	}
}

// TestBadTokenFileRefusesToStart: a malformed token file stops the start,
// naming the line and not the token.
func TestBadTokenFileRefusesToStart(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	os.WriteFile(tokens, []byte("read "+tokRead+"\nsuperuser "+tokAdmin+"\n"), 0o600)
	out, err := exec.Command(rbdBin, "serve", "--addr", "127.0.0.1:0", "--data", filepath.Join(dir, "d"), "--token-file", tokens).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "line 2") || strings.Contains(string(out), tokAdmin) || strings.Contains(string(out), tokRead) {
		t.Fatalf("%v:\n%s", err, out)
	}
}

// TestCollectOverHTTPS: rbd collect writes to an https:// server with the
// CA and a write token.
func TestCollectOverHTTPS(t *testing.T) {
	p := newPKI(t)
	srv := p.serve(t)
	out, err := exec.Command(rbdBin, "collect", "--env", "cartpole", "--frames", "512", "--url", srv.URL,
		"--ca", p.caFile, "--token", tokAdmin).CombinedOutput()
	if err != nil {
		t.Fatalf("rbd collect over https: %v\n%s", err, out)
	}
	info, err := p.client(t, srv.URL, tokRead).Info(ctx(t), "cartpole")
	if err != nil || info.WriteCount < 512 {
		t.Fatalf("after collect: %+v %v", info, err)
	}
}
