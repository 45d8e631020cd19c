//go:build !rbd_blocks

package storage

// formatV3Built is false: CreateBuffer refuses row_meta "blocks" unless a
// test allowed it on its store (blocks_on.go).
const formatV3Built = false
