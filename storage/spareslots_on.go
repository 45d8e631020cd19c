//go:build rbd_spareslots

package storage

// spareSlotsInMemory gives new memory buffers a spare block of slots
// (ringSlotCount), so that every test run with
// `go test -tags rbd_spareslots` checks the code that maps seqs to slots
// against rings of more slots than capacity, which format version 3 files
// will have (docs/proposals/format-v3.md). Memory buffers restored from
// checkpoint files keep one slot a row, as their files do.
const spareSlotsInMemory = true
