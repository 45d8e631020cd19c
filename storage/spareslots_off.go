//go:build !rbd_spareslots

package storage

// spareSlotsInMemory is true only in builds with the rbd_spareslots tag
// (spareslots_on.go).
const spareSlotsInMemory = false
