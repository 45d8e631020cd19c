//go:build rbd_blocks

package storage

// formatV3Built lets CreateBuffer make memmap buffers with row_meta
// "blocks" (rows.meta format version 3) in builds with the rbd_blocks
// tag, which .ci/run uses to run the storage suite with every memmap test
// buffer on version 3 (RBD_TEST_MEMMAP_ROW_META=blocks) while the version
// is built. Other builds refuse it with ErrNotSupported.
const formatV3Built = true
