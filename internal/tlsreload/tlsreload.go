package tlsreload

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Reloader holds the current certificate and client CA pool.
type Reloader struct {
	certFile, keyFile, caFile string

	cert atomic.Pointer[tls.Certificate]
	cas  atomic.Pointer[x509.CertPool] // nil without a client CA

	mu     sync.Mutex // guards stamps
	stamps []fileStamp
}

type fileStamp struct {
	mod  time.Time
	size int64
}

// New loads certFile and keyFile (PEM) and, if caFile is not empty, the
// CA certificates that client certificates must chain to (mutual TLS).
func New(certFile, keyFile, caFile string) (*Reloader, error) {
	r := &Reloader{certFile: certFile, keyFile: keyFile, caFile: caFile}
	if err := r.Reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// Reload reads the files again. On an error nothing changes: the pair
// loaded before stays in use (and Changed stays false until the files
// change again, so a broken file is not retried in a loop).
func (r *Reloader) Reload() error {
	stamps := r.stat()
	r.mu.Lock()
	r.stamps = stamps
	r.mu.Unlock()
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return fmt.Errorf("load TLS key pair %s, %s: %w", r.certFile, r.keyFile, err)
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return fmt.Errorf("parse %s: %w", r.certFile, err)
		}
	}
	var pool *x509.CertPool
	if r.caFile != "" {
		pem, err := os.ReadFile(r.caFile)
		if err != nil {
			return fmt.Errorf("read client CA %s: %w", r.caFile, err)
		}
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("client CA %s: no PEM certificate in it", r.caFile)
		}
	}
	r.cert.Store(&cert)
	if pool != nil {
		r.cas.Store(pool)
	}
	return nil
}

// NotAfter returns when the certificate in use expires.
func (r *Reloader) NotAfter() time.Time { return r.cert.Load().Leaf.NotAfter }

// Changed reports whether any of the files changed (modification time or
// size) since the last load: a cheap poll for rotation in place.
func (r *Reloader) Changed() bool {
	now := r.stat()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(now) != len(r.stamps) {
		return true
	}
	for i := range now {
		if now[i] != r.stamps[i] {
			return true
		}
	}
	return false
}

func (r *Reloader) stat() []fileStamp {
	var out []fileStamp
	for _, f := range []string{r.certFile, r.keyFile, r.caFile} {
		if f == "" {
			continue
		}
		st, err := os.Stat(f) // follows symlinks, as Secret mounts use
		if err != nil {
			out = append(out, fileStamp{})
			continue
		}
		out = append(out, fileStamp{mod: st.ModTime(), size: st.Size()})
	}
	return out
}

// Config returns the server's TLS configuration: TLS 1.2 or later, the
// current certificate for every new handshake and, with a client CA, a
// client certificate required and verified against the current pool.
func (r *Reloader) Config() *tls.Config {
	base := &tls.Config{MinVersion: tls.VersionTLS12}
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{*r.cert.Load()}}
		if pool := r.cas.Load(); pool != nil {
			c.ClientCAs = pool
			c.ClientAuth = tls.RequireAndVerifyClientCert
		}
		return c, nil
	}
	// Used only if GetConfigForClient were bypassed.
	base.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		if c := r.cert.Load(); c != nil {
			return c, nil
		}
		return nil, errors.New("no certificate loaded")
	}
	return base
}

// ClientConfig returns a client TLS configuration that trusts the CA
// certificates in caFile (the system pool when empty) and, with certFile
// and keyFile, presents that client certificate (mutual TLS).
func ClientConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("read CA %s: %w", caFile, err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA %s: no PEM certificate in it", caFile)
		}
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("a client certificate needs both its certificate and its key file")
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("load client key pair %s, %s: %w", certFile, keyFile, err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}
