// Package tlsreload serves a TLS certificate, and optionally a CA for
// client certificates, that can be replaced while the server runs: new
// handshakes use what was loaded last, connections already open go on, and
// a pair that fails to load keeps the one before it. Certificates rotated
// in place (cert-manager, Kubernetes Secrets mounted as files) are picked
// up without a restart.
package tlsreload
