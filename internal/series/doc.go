// Package series keeps a short history of a few numbers, one point per
// second, for the dashboard's charts.
//
// A Ring is written where the numbers change (a write, a sample, a
// collector batch), not by a timer: a buffer nobody touches costs nothing,
// and a second in which nothing changed has no point (a reader carries the
// previous values over the gap). Memory is fixed when the ring is made.
package series
