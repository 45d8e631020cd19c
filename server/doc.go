// Package server is rbd's HTTP API (v1): buffers are created, extended and
// sampled over plain HTTP, tensors travel as safetensors (JSON for people),
// control bodies as JSON. The contract — paths, bodies, status codes and
// the {"error": ...} shape of every failure — is in docs/http-api.md and
// docs/openapi.yaml.
//
// Every malformed request gets a 4xx naming the field at fault, and is
// rejected before the store is touched: an extend body is decoded and
// validated whole before any row is written, so a client that disconnects
// mid-body changes nothing.
package server
