package main

import (
	"errors"

	"github.com/spf13/pflag"

	"github.com/rbdb/rbd/client"
)

func errorsJoin(errs ...error) error { return errors.Join(errs...) }

// tlsClientFlags are the flags of commands that talk to a server over
// https:// with a private CA or a client certificate.
type tlsClientFlags struct {
	ca, cert, key string
}

func (t *tlsClientFlags) addFlags(f *pflag.FlagSet) {
	f.StringVar(&t.ca, "ca", "", "for an https:// --url: trust the PEM CA certificates in this file")
	f.StringVar(&t.cert, "cert", "", "for an https:// --url: a PEM client certificate (mutual TLS)")
	f.StringVar(&t.key, "key", "", "the PEM private key of --cert")
}

// newClient returns a client for url with the token and TLS flags.
func (t *tlsClientFlags) newClient(url, token string) (*client.Client, error) {
	return client.New(url, &client.Options{Token: token, CAFile: t.ca, CertFile: t.cert, KeyFile: t.key})
}
