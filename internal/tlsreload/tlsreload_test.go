package tlsreload

import (
	"crypto/tls"
	"errors"
	"io"
	"io/fs"
	"math/big"
	"net"
	"path/filepath"
	"testing"

	"github.com/rbdb/rbd/internal/testbin"
)

// pki is a CA with a server pair written to dir as cert.pem, key.pem and
// ca.pem.
type pki struct {
	t   *testing.T
	dir string
	ca  *testbin.CA
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	ca, err := testbin.NewCA("tlsreload test CA")
	if err != nil {
		t.Fatal(err)
	}
	p := &pki{t: t, dir: t.TempDir(), ca: ca}
	if err := testbin.WriteFiles(p.dir, map[string][]byte{"ca.pem": ca.CertPEM}); err != nil {
		t.Fatal(err)
	}
	p.rotate()
	return p
}

// rotate issues a new server pair, writes it and returns its serial.
func (p *pki) rotate() *big.Int {
	p.t.Helper()
	cert, key, serial, err := p.ca.Issue("server", false)
	if err != nil {
		p.t.Fatal(err)
	}
	if err := testbin.WriteFiles(p.dir, map[string][]byte{"cert.pem": cert, "key.pem": key}); err != nil {
		p.t.Fatal(err)
	}
	return serial
}

func (p *pki) path(name string) string { return filepath.Join(p.dir, name) }

// serve accepts TLS connections on loopback with r's configuration and
// answers each with one byte after the handshake.
func serve(t *testing.T, r *Reloader) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", r.Config())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if err := c.(*tls.Conn).Handshake(); err == nil {
					c.Write([]byte{1})
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// handshake dials addr and returns the serial of the certificate the
// server presented.
func handshake(addr string, conf *tls.Config) (*big.Int, error) {
	c, err := tls.DialWithDialer(&net.Dialer{}, "tcp", addr, conf)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	// With TLS 1.3 a refused client certificate shows on the first read.
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		return nil, err
	}
	return c.ConnectionState().PeerCertificates[0].SerialNumber, nil
}

func TestReloadKeepsThePairInUseOnError(t *testing.T) {
	p := newPKI(t)
	r, err := New(p.path("cert.pem"), p.path("key.pem"), "")
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, r)
	client, err := ClientConfig(p.path("ca.pem"), "", "")
	if err != nil {
		t.Fatal(err)
	}
	first, err := handshake(addr, client)
	if err != nil {
		t.Fatal(err)
	}
	if r.Changed() {
		t.Fatal("Changed right after a load")
	}

	second := p.rotate()
	if !r.Changed() {
		t.Fatal("Changed is false after the pair was replaced")
	}
	if got, _ := handshake(addr, client); got.Cmp(first) != 0 {
		t.Fatalf("served serial %v before Reload, want the first pair's %v", got, first)
	}
	if err := r.Reload(); err != nil {
		t.Fatal(err)
	}
	if got, _ := handshake(addr, client); got.Cmp(second) != 0 {
		t.Fatalf("served serial %v after Reload, want the new pair's %v", got, second)
	}

	broken := []struct {
		name  string
		files map[string][]byte
	}{
		{"key of another pair", func() map[string][]byte {
			_, key, _, _ := p.ca.Issue("other", false)
			return map[string][]byte{"key.pem": key}
		}()},
		{"garbage certificate", map[string][]byte{"cert.pem": []byte("not a certificate")}},
		{"empty files", map[string][]byte{"cert.pem": nil, "key.pem": nil}},
	}
	for _, b := range broken {
		t.Run(b.name, func(t *testing.T) {
			if err := testbin.WriteFiles(p.dir, b.files); err != nil {
				t.Fatal(err)
			}
			if err := r.Reload(); err == nil {
				t.Fatal("Reload of a broken pair succeeded")
			}
			if r.Changed() {
				t.Fatal("Changed is true after a failed load of unchanged files: it would retry in a loop")
			}
			got, err := handshake(addr, client)
			if err != nil {
				t.Fatalf("handshake after a failed reload: %v", err)
			}
			if got.Cmp(second) != 0 {
				t.Fatalf("served serial %v after a failed reload, want the pair before it (%v)", got, second)
			}
			p.rotate() // a good pair again for the next case
			if err := r.Reload(); err != nil {
				t.Fatal(err)
			}
			second, _ = handshake(addr, client)
		})
	}
}

func TestClientCertificates(t *testing.T) {
	p := newPKI(t)
	r, err := New(p.path("cert.pem"), p.path("key.pem"), p.path("ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, r)

	stranger, err := testbin.NewCA("another CA")
	if err != nil {
		t.Fatal(err)
	}
	issue := func(ca *testbin.CA, name string) (string, string) {
		cert, key, _, err := ca.Issue(name, true)
		if err != nil {
			t.Fatal(err)
		}
		if err := testbin.WriteFiles(p.dir, map[string][]byte{name + ".pem": cert, name + "-key.pem": key}); err != nil {
			t.Fatal(err)
		}
		return p.path(name + ".pem"), p.path(name + "-key.pem")
	}
	goodCert, goodKey := issue(p.ca, "actor")
	badCert, badKey := issue(stranger, "intruder")

	cases := []struct {
		name      string
		cert, key string
		ok        bool
	}{
		{"certificate from the client CA", goodCert, goodKey, true},
		{"no client certificate", "", "", false},
		{"certificate from another CA", badCert, badKey, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conf, err := ClientConfig(p.path("ca.pem"), c.cert, c.key)
			if err != nil {
				t.Fatal(err)
			}
			_, err = handshake(addr, conf)
			if c.ok && err != nil {
				t.Fatalf("handshake refused: %v", err)
			}
			if !c.ok && err == nil {
				t.Fatal("handshake accepted")
			}
		})
	}
}

func TestLoadErrors(t *testing.T) {
	p := newPKI(t)
	if err := testbin.WriteFiles(p.dir, map[string][]byte{"notpem.pem": []byte("hello")}); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name                string
		cert, key, clientCA string
	}{
		{"missing certificate", p.path("nope.pem"), p.path("key.pem"), ""},
		{"missing key", p.path("cert.pem"), p.path("nope.pem"), ""},
		{"missing client CA", p.path("cert.pem"), p.path("key.pem"), p.path("nope.pem")},
		{"client CA without a certificate", p.path("cert.pem"), p.path("key.pem"), p.path("notpem.pem")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := New(c.cert, c.key, c.clientCA); err == nil {
				t.Fatal("New succeeded")
			}
		})
	}
	if _, err := ClientConfig("", p.path("cert.pem"), ""); err == nil {
		t.Fatal("ClientConfig with a certificate and no key succeeded")
	}
	if _, err := ClientConfig(p.path("notpem.pem"), "", ""); err == nil {
		t.Fatal("ClientConfig with a CA file without a certificate succeeded")
	}
	_, err := ClientConfig(p.path("nope.pem"), "", "")
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("ClientConfig error %v does not wrap the file error", err)
	}
}
