package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/rbdb/rbd/internal/tlsreload"
	"github.com/rbdb/rbd/server"
)

// secrets are what rbd serve reads from files and reloads while it runs:
// the token file and the TLS pair (and client CA). SIGHUP reloads both,
// and so does a change of the files (a poll every few seconds: Kubernetes
// rotates Secrets mounted as files without a signal). A file that fails to
// load keeps what was loaded before, and says why in the log.
type secrets struct {
	tokenFile string
	tokenMod  fileMark
	tls       *tlsreload.Reloader
	log       *slog.Logger
	srv       *server.Server
	hup       chan os.Signal // SIGHUP, caught from the start: it never stops the server
}

type fileMark struct {
	mod  time.Time
	size int64
}

func markOf(path string) fileMark {
	st, err := os.Stat(path)
	if err != nil {
		return fileMark{}
	}
	return fileMark{st.ModTime(), st.Size()}
}

// secretsPollEvery is how often the files are checked for changes.
const secretsPollEvery = 5 * time.Second

// loadSecrets reads the token file and the TLS files at start. Any error
// refuses to start, naming the file and line (never a token).
func loadSecrets(o *serveOptions, log *slog.Logger) (*secrets, *server.Tokens, error) {
	s := &secrets{tokenFile: o.tokenFile, log: log, hup: make(chan os.Signal, 1)}
	signal.Notify(s.hup, syscall.SIGHUP)
	var tokens *server.Tokens
	if o.tokenFile != "" {
		t, err := readTokenFile(o.tokenFile)
		if err != nil {
			return nil, nil, err
		}
		tokens, s.tokenMod = t, markOf(o.tokenFile)
	}
	switch {
	case (o.tlsCert == "") != (o.tlsKey == ""):
		return nil, nil, fmt.Errorf("--tls-cert and --tls-key go together")
	case o.tlsClientCA != "" && o.tlsCert == "":
		return nil, nil, fmt.Errorf("--tls-client-ca needs --tls-cert and --tls-key")
	case o.tlsCert != "":
		r, err := tlsreload.New(o.tlsCert, o.tlsKey, o.tlsClientCA)
		if err != nil {
			return nil, nil, err
		}
		s.tls = r
	}
	return s, tokens, nil
}

func readTokenFile(path string) (*server.Tokens, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--token-file: %w", err)
	}
	t, err := server.ParseTokenFile(data)
	if err != nil {
		return nil, fmt.Errorf("--token-file %s: %w", path, err)
	}
	return t, nil
}

// reload reads the files again; what fails to load is kept as it was.
func (s *secrets) reload(why string) {
	if s.tokenFile != "" {
		// Noted before the read: a broken file is tried again only once
		// it changes, not at every poll.
		s.tokenMod = markOf(s.tokenFile)
		if t, err := readTokenFile(s.tokenFile); err != nil {
			s.log.Error("tokens not reloaded: the ones loaded before stay in use", "why", why, "err", err)
		} else {
			s.srv.SetTokens(t)
			s.log.Info("tokens reloaded", "why", why, "tokens", t.Len())
		}
	}
	if s.tls != nil {
		if err := s.tls.Reload(); err != nil {
			s.log.Error("TLS certificate not reloaded: the one loaded before stays in use", "why", why, "err", err)
		} else {
			s.log.Info("TLS certificate reloaded", "why", why, "not_after", s.tls.NotAfter())
		}
	}
}

// watch reloads on SIGHUP and when a file changes, until ctx ends. SIGHUP
// never stops the server.
func (s *secrets) watch(ctx context.Context) {
	defer signal.Stop(s.hup)
	t := time.NewTicker(secretsPollEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.hup:
			s.reload("SIGHUP")
		case <-t.C:
			changed := s.tokenFile != "" && markOf(s.tokenFile) != s.tokenMod
			if changed || (s.tls != nil && s.tls.Changed()) {
				s.reload("a file changed")
			}
		}
	}
}
