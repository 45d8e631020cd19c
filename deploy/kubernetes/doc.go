// Package kubernetes holds rbd's Kubernetes manifests (rbd.yaml) and the
// test that checks them: every document decodes strictly into the
// Kubernetes API types pinned in go.mod (k8s.io/api), and the pieces fit
// together (docs/scale-out.md, "Deployment").
package kubernetes
