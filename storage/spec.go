package storage

import (
	"github.com/rbdb/rbd/ratelimit"

	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Kind selects how a buffer keeps its rows.
type Kind string

// The storage kinds. The strings are part of the HTTP contract.
const (
	// KindMemory keeps rows in process memory only; they are lost on restart.
	KindMemory Kind = "memory"
	// KindMemmap keeps rows in memory-mapped column files so that a buffer
	// survives restarts and may grow beyond RAM.
	KindMemmap Kind = "memmap"
	// KindCompressed is persistent like memmap, but large fields are kept
	// in zstd-compressed chunks of consecutive steps of one trajectory
	// (see docs/memory-efficient.md); small fields stay in plain columns.
	KindCompressed Kind = "compressed"
)

// Durability says how hard a persistent buffer works to get written rows onto
// disk before acknowledging them, trading ingest throughput against how many
// recent rows a crash may lose.
type Durability string

// The durability levels. The strings are part of the HTTP contract.
const (
	// DurabilityNone leaves write-back entirely to the operating system.
	DurabilityNone Durability = "none"
	// DurabilityFlush hands written pages to the OS before acknowledging, so
	// a crash of the process (but not of the machine) loses nothing.
	DurabilityFlush Durability = "flush"
	// DurabilityFsync waits for the data to reach stable storage, so acknowledged
	// rows survive power loss too.
	DurabilityFsync Durability = "fsync"
)

// RowMetaLayout says how a memory or memmap buffer keeps its rows' metadata
// (traj_id, step, prev_seq, env, policy_version, flags).
type RowMetaLayout string

// The row metadata layouts. The strings are part of the HTTP contract.
const (
	// RowMetaPerRow keeps every row's metadata in a 32-byte record in the
	// row's line (memory buffers, whose default it is: the fastest
	// samples) or a 64-byte file record (compressed buffers, and memmap
	// buffers that ask for it or were created before 2026-11-27: rows.meta
	// format version 1, which older builds open).
	RowMetaPerRow RowMetaLayout = "row"
	// RowMetaRuns keeps a 16-byte record per row and what the consecutive
	// rows of a trajectory share in one run record. In memory: about 15
	// bytes a row less for small rows (a compact CartPole row group 48
	// bytes, not 64), and a second cache line per sampled row (256-row
	// samples 5-15% slower at 10^5 rows, 12-35% at 10^7; extends 5-10%
	// slower; docs/performance.md). In a memmap buffer (the default of
	// new ones from 2026-11-27 to 2026-11-29): rows.meta in format
	// version 2 (16 bytes a slot, not 64) and a run log, with 16-byte
	// memory records for readers. Not for compressed buffers.
	RowMetaRuns RowMetaLayout = "runs"
	// RowMetaStrided (memory and memmap buffers) keeps an 8-byte record per
	// row: a 32-bit stamp of the row's pass round the ring (its low 31
	// bits: seqs have no bound of their own) and its run's handle and
	// flags. A run is a stretch of a trajectory whose rows are
	// equally many seqs apart (envs stepping in lockstep, as collectors
	// and vectorised environments write them), so a row's step and
	// previous row follow from its seq. A compact CartPole row group is
	// 40 bytes, not 48 or 64. Rows that keep no stride (actors writing
	// steps of one trajectory at irregular intervals) go to irregular
	// runs, which keep each row's offset and distance back in 4 bytes of
	// a side table.
	RowMetaStrided RowMetaLayout = "strided"
	// RowMetaBlocks (memmap buffers) keeps rows.meta in format version 3
	// (docs/format.md): no file record per row, a checksum per block of
	// 64 slots kept in two copies, pieces of trajectories with a stride in
	// the run log, and in memory the 16-byte records of "runs" (the 8-byte
	// strided ones made CartPole samples 12% slower). The default of new
	// memmap buffers since 2026-11-29 (CreateBuffer writes it into the
	// spec of a memmap buffer whose spec leaves row_meta out): a compact
	// CartPole row takes 37 bytes of files, against 52 with "runs".
	RowMetaBlocks RowMetaLayout = "blocks"
)

// runLogFiles reports whether a buffer of s keeps rows.meta in format
// version 2 with a run log: memmap buffers with row_meta "runs" or
// "strided" (the two differ in their memory records only).
func (s Spec) runLogFiles() bool {
	return s.Storage == KindMemmap && (s.RowMetaLayout == RowMetaRuns || s.RowMetaLayout == RowMetaStrided || s.RowMetaLayout == RowMetaBlocks)
}

// blockFiles reports whether a buffer of s keeps rows.meta in format
// version 3 (block records) with a version 3 run log.
func (s Spec) blockFiles() bool {
	return s.Storage == KindMemmap && s.RowMetaLayout == RowMetaBlocks
}

// Limits enforced by Validate. They exist to turn absurd requests (usually
// typos or unit mix-ups) into clear errors before any file is sized from them.
const (
	specMaxCapacity     = 1 << 40
	specMaxDims         = 8
	specMaxRowBytes     = 256 << 20
	specMaxFieldNameLen = 128
)

// Defaults filled by WithDefaults and by decoding.
const (
	specDefaultObsKey = "observation"
	specDefaultCodec  = "zstd"
	specDefaultLevel  = 1
	specDefaultChunk  = 32
	specDefaultCache  = 64
	specMaxChunkLen   = 4096
	specMaxCacheMiB   = 1 << 20
	// compressMinBytes is the row size from which a field of a compressed
	// buffer is compressed unless it says otherwise: smaller fields gain
	// little and would cost a chunk decode per sampled row.
	compressMinBytes = 64
	// maxChunkRawBytes bounds one field of one chunk, decoded.
	maxChunkRawBytes = 1 << 30
	specDefaultAlpha = 0.6
	specDefaultEps   = 1e-6
)

// FrameStack declares that a field is a stack of the last K frames along
// Axis (Shape[Axis] == K). A compressed buffer then stores only each row's
// newest frame when the older ones repeat the previous row's, and rebuilds
// the stack at sample time, which saves nearly K-fold for image observations.
type FrameStack struct {
	K    int `json:"k"`
	Axis int `json:"axis"`
}

// Field declares one column of a buffer.
type Field struct {
	Name  string
	DType DType
	// Shape is the per-row shape; empty means one scalar per row.
	Shape []int
	// Compress opts a field in or out of compression on compressed buffers;
	// nil means compress when a row is at least 64 bytes or the field has
	// a frame stack. Episode flags are never compressed.
	Compress *bool
	// FrameStack is nil for ordinary fields.
	FrameStack *FrameStack
	// Mutable lets Buffer.UpdateFields (POST .../update) set the field of
	// live rows after they are written, e.g. recurrent states a learner
	// recomputed. false (the default) means rows are immutable. A mutable
	// field is kept plain (never in compressed chunks) and left out of the
	// row's data checksum, and cannot be an episode flag, an obs key or
	// frame-stacked (see docs/format.md and docs/recurrent.md).
	Mutable bool
}

// RowElems returns the number of elements one row of the field holds: the
// product of Shape, which is 1 for a scalar. It assumes a validated shape.
func (f Field) RowElems() int {
	n := 1
	for _, d := range f.Shape {
		n *= d
	}
	return n
}

// RowBytes returns the number of bytes one row of the field occupies in its
// column. It assumes a validated field.
func (f Field) RowBytes() int {
	return f.RowElems() * f.DType.Size()
}

// clone returns a copy of f that shares no memory with it.
func (f Field) clone() Field {
	c := f
	c.Shape = slices.Clone(f.Shape)
	if f.Compress != nil {
		v := *f.Compress
		c.Compress = &v
	}
	if f.FrameStack != nil {
		v := *f.FrameStack
		c.FrameStack = &v
	}
	return c
}

// PriorityOptions configures proportional prioritised sampling, where a row
// is drawn with probability proportional to (priority + Eps)^Alpha.
type PriorityOptions struct {
	// Alpha is the prioritisation exponent; 0 means uniform sampling, which
	// is why a missing alpha is filled at decode time rather than treated as 0.
	Alpha float64 `json:"alpha"`
	// Eps keeps rows with zero priority sampleable.
	Eps float64 `json:"eps"`
}

// DefaultPriority returns the customary settings from the prioritised
// experience replay paper, used for any key a client leaves out.
func DefaultPriority() PriorityOptions {
	return PriorityOptions{Alpha: specDefaultAlpha, Eps: specDefaultEps}
}

// CompressionOptions configures the chunks of a compressed buffer. Zero
// values mean the defaults (decoding a spec fills them in).
type CompressionOptions struct {
	// Codec is "zstd" (default) or "none" (chunks and frame dedup without
	// entropy coding: for measuring, or for data zstd cannot shrink).
	Codec string `json:"codec"`
	// Level is the zstd level, 1 (default, fastest) to 22.
	Level int `json:"level"`
	// ChunkLen is how many consecutive rows of one trajectory share a chunk
	// (default 32). Longer chunks compress better and cost more to decode
	// for one sampled row.
	ChunkLen int `json:"chunk_len"`
	// Delta XORs each row with the previous row of its chunk before
	// compressing, which helps slowly changing values.
	Delta bool `json:"delta"`
	// CacheMiB bounds the cache of decoded chunks (default 64).
	CacheMiB int `json:"cache_mib"`
}

func (c *CompressionOptions) fillDefaults() {
	if c.Codec == "" {
		c.Codec = specDefaultCodec
	}
	if c.Level == 0 && c.Codec == specDefaultCodec {
		c.Level = specDefaultLevel
	}
	if c.ChunkLen == 0 {
		c.ChunkLen = specDefaultChunk
	}
	if c.CacheMiB == 0 {
		c.CacheMiB = specDefaultCache
	}
}

// Spec describes a buffer: its capacity, where rows live and what each row
// holds. It is what clients send to create a buffer and what is persisted
// alongside it, so its JSON form is a public contract; see MarshalJSON.
type Spec struct {
	// Capacity is the number of rows kept before the oldest are overwritten.
	Capacity int64
	Storage  Kind
	// Fields are in declaration order, which fixes column order in listings
	// and on disk; it carries no other meaning (see Equal).
	Fields []Field
	// CompactObs stores each observation once and rebuilds next.<obs key> at
	// sample time from the following step, halving observation storage.
	CompactObs bool
	// ObsKeys names the fields that are observations.
	ObsKeys []string
	// Priority enables prioritised sampling; nil means uniform sampling only.
	Priority    *PriorityOptions
	Durability  Durability
	Compression *CompressionOptions
	// RowMetaLayout is a memory or memmap buffer's row metadata layout
	// ("row_meta"). Left out (""): RowMetaPerRow for memory buffers;
	// CreateBuffer makes it RowMetaBlocks for a new memmap buffer, or
	// RowMetaRuns for an fsync one or a ring under 1,024 rows (it made
	// RowMetaRuns for all from 2026-11-27 to 2026-11-29), and in a catalog
	// written before 2026-11-27 "" is RowMetaPerRow. Asked of an existing
	// buffer, "" matches the layout it has.
	RowMetaLayout RowMetaLayout
	// RateLimit is the buffer's flow control (nil: none). It can change
	// while the buffer is open (Buffer.SetRateLimit), so Equal ignores it:
	// creating a buffer again with another rate limit finds the existing
	// one, whose limit stays as it is.
	RateLimit *ratelimit.Params
}

// ErrInvalidSpec is matched (with errors.Is) by every problem found in a spec,
// whatever its more specific cause, so that callers such as the HTTP layer
// can map all of them to one client error.
var ErrInvalidSpec = errors.New("storage: invalid spec")

// ErrNotSupported marks requests for features that are planned but not built
// yet, so that callers can tell "never valid" from "not valid yet". No spec
// option returns it today (compressed storage, compress and frame_stack,
// once behind it, exist now); callers may keep checking for it.
var ErrNotSupported = errors.New("storage: not supported yet")

// SpecError is one problem with a spec. Path locates it the way a client
// would find it in the JSON, e.g. "capacity", "fields.observation.shape" or
// "obs_keys[1]", so that error messages can be acted on without guessing.
type SpecError struct {
	Path string
	Msg  string
	// Err is the underlying cause, if there is a more specific one than an
	// invalid spec: ErrNotSupported, or a JSON syntax error. It may be nil.
	Err error
}

// Error returns "spec: <path>: <msg>".
func (e *SpecError) Error() string {
	if e.Path == "" {
		return "spec: " + e.Msg
	}
	return "spec: " + e.Path + ": " + e.Msg
}

// Unwrap returns the specific cause if there is one, and ErrInvalidSpec
// otherwise.
func (e *SpecError) Unwrap() error {
	if e.Err != nil {
		return e.Err
	}
	return ErrInvalidSpec
}

// Is makes every SpecError match ErrInvalidSpec even when Unwrap leads to a
// more specific cause such as ErrNotSupported.
func (e *SpecError) Is(target error) bool {
	return target == ErrInvalidSpec
}

// ParseSpec decodes a spec from JSON, fills defaults and validates it, which
// is everything needed before a client's spec can be trusted.
func ParseSpec(data []byte) (Spec, error) {
	var s Spec
	if err := s.UnmarshalJSON(data); err != nil {
		return Spec{}, err
	}
	s = s.WithDefaults()
	if err := s.Validate(); err != nil {
		return Spec{}, err
	}
	return s, nil
}

// Clone returns a deep copy of s, so that a buffer can keep its spec without
// the caller being able to change it afterwards. Nil and empty slices are
// preserved as they are.
func (s Spec) Clone() Spec {
	c := s
	if s.Fields != nil {
		c.Fields = make([]Field, len(s.Fields))
		for i, f := range s.Fields {
			c.Fields[i] = f.clone()
		}
	}
	c.ObsKeys = slices.Clone(s.ObsKeys)
	if s.Priority != nil {
		v := *s.Priority
		c.Priority = &v
	}
	if s.Compression != nil {
		v := *s.Compression
		c.Compression = &v
	}
	if s.RateLimit != nil {
		v := *s.RateLimit
		c.RateLimit = &v
	}
	return c
}

// WithDefaults returns a deep copy of s with every omitted setting filled in,
// so that code downstream never has to know the defaults. Priority defaults
// are not filled here: a nil Priority means "off", and partially given
// priority options are completed when decoding.
func (s Spec) WithDefaults() Spec {
	c := s.Clone()
	if c.Storage == "" {
		c.Storage = KindMemmap
	}
	if len(c.ObsKeys) == 0 {
		c.ObsKeys = []string{specDefaultObsKey}
	}
	if c.Durability == "" && (c.Storage == KindMemmap || c.Storage == KindCompressed) {
		c.Durability = DurabilityFlush
	}
	if c.Compression == nil && c.Storage == KindCompressed {
		c.Compression = &CompressionOptions{}
	}
	if c.Compression != nil {
		c.Compression.fillDefaults()
	}
	for i := range c.Fields {
		if c.Fields[i].Shape == nil {
			c.Fields[i].Shape = []int{}
		}
	}
	return c
}

// Field returns a copy of the field with the given name.
func (s Spec) Field(name string) (Field, bool) {
	for _, f := range s.Fields {
		if f.Name == name {
			return f.clone(), true
		}
	}
	return Field{}, false
}

// HasField reports whether s declares a field with the given name.
func (s Spec) HasField(name string) bool {
	return slices.ContainsFunc(s.Fields, func(f Field) bool { return f.Name == name })
}

// Equal reports whether s and o describe the same buffer: they are compared
// after WithDefaults, so spelling a default out makes no difference, and
// field order is ignored because JSON clients cannot be relied on to keep
// object keys in order. RateLimit is not compared: it is a setting of the
// running buffer, not of its data. Everything else, including the order of
// ObsKeys, must match.
func (s Spec) Equal(o Spec) bool {
	a, b := s.WithDefaults(), o.WithDefaults()
	if a.Capacity != b.Capacity || a.Storage != b.Storage || a.CompactObs != b.CompactObs ||
		a.Durability != b.Durability || !slices.Equal(a.ObsKeys, b.ObsKeys) ||
		cmp.Or(a.RowMetaLayout, RowMetaPerRow) != cmp.Or(b.RowMetaLayout, RowMetaPerRow) {
		return false
	}
	if (a.Priority == nil) != (b.Priority == nil) || (a.Priority != nil && *a.Priority != *b.Priority) {
		return false
	}
	if (a.Compression == nil) != (b.Compression == nil) || (a.Compression != nil && *a.Compression != *b.Compression) {
		return false
	}
	if len(a.Fields) != len(b.Fields) {
		return false
	}
	// Sorting by a total order over every attribute, not just the name,
	// keeps the comparison exact even for (invalid) duplicate names.
	slices.SortFunc(a.Fields, compareFields)
	slices.SortFunc(b.Fields, compareFields)
	return slices.EqualFunc(a.Fields, b.Fields, func(x, y Field) bool { return compareFields(x, y) == 0 })
}

// compareFields is a total order over fields for Equal.
func compareFields(x, y Field) int {
	// cmp.Compare does not order bools; false sorts first.
	order := func(b bool) int {
		if b {
			return 1
		}
		return 0
	}
	if c := cmp.Compare(x.Name, y.Name); c != 0 {
		return c
	}
	if c := cmp.Compare(x.DType, y.DType); c != 0 {
		return c
	}
	if c := slices.Compare(x.Shape, y.Shape); c != 0 {
		return c
	}
	if c := cmp.Compare(order(x.Compress != nil), order(y.Compress != nil)); c != 0 {
		return c
	}
	if x.Compress != nil {
		if c := cmp.Compare(order(*x.Compress), order(*y.Compress)); c != 0 {
			return c
		}
	}
	if c := cmp.Compare(order(x.Mutable), order(y.Mutable)); c != 0 {
		return c
	}
	if c := cmp.Compare(order(x.FrameStack != nil), order(y.FrameStack != nil)); c != 0 {
		return c
	}
	if x.FrameStack != nil {
		if c := cmp.Compare(x.FrameStack.K, y.FrameStack.K); c != 0 {
			return c
		}
		return cmp.Compare(x.FrameStack.Axis, y.FrameStack.Axis)
	}
	return 0
}

// specJoinPath extends an error path by one object key. An empty key is shown
// quoted, since "fields." would look like a truncated message.
func specJoinPath(parent, key string) string {
	switch {
	case key == "":
		return parent + `[""]`
	case parent == "":
		return key
	default:
		return parent + "." + key
	}
}

// specFieldPath is the error path of the field with the given name.
func specFieldPath(name string) string {
	return specJoinPath("fields", name)
}

// Validate reports every problem with s rather than only the first, so that
// a client can fix a spec in one go. The result is nil or an errors.Join of
// *SpecError values, ordered as their paths appear in the JSON form.
//
// Validate judges s as it will be used, that is after WithDefaults, so a spec
// that relies on defaults is valid.
func (s Spec) Validate() error {
	var v specValidator
	v.validate(s.WithDefaults())
	return errors.Join(v.errs...)
}

// specValidator accumulates the problems found in one spec.
type specValidator struct {
	errs []error
}

func (v *specValidator) add(path, format string, args ...any) {
	v.errs = append(v.errs, &SpecError{Path: path, Msg: fmt.Sprintf(format, args...)})
}

// validate checks s in the order its keys are marshaled, which is what
// makes the error order deterministic.
func (v *specValidator) validate(s Spec) {
	capacityOK := s.Capacity >= 1 && s.Capacity <= specMaxCapacity
	if !capacityOK {
		v.add("capacity", "must be between 1 and %d (1<<40), got %d", int64(specMaxCapacity), s.Capacity)
	}

	switch s.Storage {
	case KindMemory, KindMemmap, KindCompressed:
	default:
		v.add("storage", "unknown storage kind %q; want one of %s, %s, %s", s.Storage, KindMemory, KindMemmap, KindCompressed)
	}

	// Observations that compact_obs rebuilds at sample time, keyed by the
	// name the client must therefore not declare.
	rebuilt := make(map[string]string)
	if s.CompactObs {
		for _, k := range s.ObsKeys {
			rebuilt["next."+k] = k
		}
	}
	if len(s.Fields) == 0 {
		v.add("fields", "at least one field is required")
	}
	declared := make(map[string]bool, len(s.Fields))
	for _, f := range s.Fields {
		path := specFieldPath(f.Name)
		if declared[f.Name] {
			v.add(path, "duplicate field name")
			continue
		}
		declared[f.Name] = true
		v.field(path, f, s.Capacity, capacityOK)
		v.fieldStorage(path, f, s)
		if k, ok := rebuilt[f.Name]; ok {
			v.add(path, "compact_obs buffers must not declare next.%s; it is rebuilt at sample time", k)
		}
	}
	if len(s.Fields) > 0 && !declared["next.done"] {
		v.add(specFieldPath("next.done"), `required field is missing; declare it as {"dtype": "bool", "shape": []}`)
	}

	seenKeys := make(map[string]bool, len(s.ObsKeys))
	for i, k := range s.ObsKeys {
		path := fmt.Sprintf("obs_keys[%d]", i)
		switch {
		case seenKeys[k]:
			v.add(path, "duplicate obs key %q", k)
		case !declared[k] && (s.CompactObs || k != specDefaultObsKey):
			// The default ["observation"] only binds compact buffers: a
			// plain buffer needs no observation field at all.
			v.add(path, "no field named %q", k)
		}
		seenKeys[k] = true
	}

	if p := s.Priority; p != nil {
		// Written as !(x >= 0) so that NaN fails too.
		if !(p.Alpha >= 0) || math.IsInf(p.Alpha, 0) {
			v.add("priority.alpha", "must be a finite number >= 0, got %v", p.Alpha)
		}
		if !(p.Eps >= 0) || math.IsInf(p.Eps, 0) {
			v.add("priority.eps", "must be a finite number >= 0, got %v", p.Eps)
		}
	}

	switch s.Durability {
	case "":
	case DurabilityNone, DurabilityFlush, DurabilityFsync:
		if s.Storage == KindMemory {
			v.add("durability", "durability applies to persistent storage kinds; memory buffers keep no rows across restarts")
		}
	default:
		v.add("durability", "unknown durability %q; want one of %s, %s, %s", s.Durability, DurabilityNone, DurabilityFlush, DurabilityFsync)
	}

	switch s.RowMetaLayout {
	case "", RowMetaPerRow:
	case RowMetaRuns, RowMetaStrided:
		if s.Storage == KindCompressed {
			v.add("row_meta", "row_meta %q applies to memory and memmap buffers; %s buffers keep 64-byte row records", s.RowMetaLayout, s.Storage)
		}
	case RowMetaBlocks:
		if s.Storage != KindMemmap {
			v.add("row_meta", "row_meta %q applies to memmap buffers only (block checksums of files); %s buffers do not keep it", s.RowMetaLayout, s.Storage)
		}
	default:
		v.add("row_meta", "unknown row_meta %q; want %s, %s, %s or %s", s.RowMetaLayout, RowMetaPerRow, RowMetaRuns, RowMetaStrided, RowMetaBlocks)
	}

	if c := s.Compression; c != nil {
		if s.Storage != KindCompressed {
			v.add("compression", "compression options apply only to %s storage, not %q", KindCompressed, s.Storage)
		}
		switch c.Codec {
		case "zstd":
			if c.Level < 1 || c.Level > 22 {
				v.add("compression.level", "zstd level must be between 1 and 22, got %d", c.Level)
			}
		case "none":
		default:
			v.add("compression.codec", "unknown codec %q; want zstd or none", c.Codec)
		}
		if c.ChunkLen < 1 || c.ChunkLen > specMaxChunkLen {
			v.add("compression.chunk_len", "must be between 1 and %d rows, got %d", specMaxChunkLen, c.ChunkLen)
		}
		if c.CacheMiB < 1 || c.CacheMiB > specMaxCacheMiB {
			v.add("compression.cache_mib", "must be between 1 and %d, got %d", specMaxCacheMiB, c.CacheMiB)
		}
	}

	if r := s.RateLimit; r != nil && capacityOK {
		for _, p := range r.Problems(s.Capacity) {
			v.add("rate_limit."+p.Key, "%s", p.Msg)
		}
	}
}

// fieldStorage checks a field's compression and frame-stack options
// against the buffer's storage kind.
func (v *specValidator) fieldStorage(path string, f Field, s Spec) {
	isFlag := f.Name == "next.done" || f.Name == "next.terminated" || f.Name == "next.truncated"
	if f.Mutable {
		switch {
		case isFlag:
			v.add(path+".mutable", "%s is an episode flag: trajectories are built from it when the row is written", f.Name)
		case s.CompactObs && slices.Contains(s.ObsKeys, f.Name):
			v.add(path+".mutable", "%s is an obs key: next observations are rebuilt from it", f.Name)
		case f.FrameStack != nil:
			v.add(path+".mutable", "a frame-stacked field shares frames between rows and cannot change")
		case f.Compress != nil && *f.Compress:
			v.add(path+".mutable", "a mutable field stays plain; drop \"compress\": true")
		}
	}
	if f.Compress != nil {
		switch {
		case s.Storage != KindCompressed:
			v.add(path+".compress", "applies only to %s storage, not %q", KindCompressed, s.Storage)
		case *f.Compress && isFlag:
			v.add(path+".compress", "%s is an episode flag and always stays plain", f.Name)
		}
	}
	if c := s.Compression; c != nil && s.Compressed(f) && f.DType.Valid() {
		// A chunk's raw bytes must stay addressable by the record's
		// 32-bit lengths; a float product cannot overflow.
		raw := float64(c.ChunkLen+1) * float64(f.DType.Size())
		for _, d := range f.Shape {
			raw *= float64(d)
		}
		if raw > maxChunkRawBytes {
			v.add(path, "a chunk of %d rows of this field would hold %.0f bytes, more than 1 GiB: lower compression.chunk_len or keep the field plain (\"compress\": false)", c.ChunkLen+1, raw)
		}
	}
	fs := f.FrameStack
	if fs == nil {
		return
	}
	fsPath := path + ".frame_stack"
	switch {
	case s.Storage != KindCompressed:
		v.add(fsPath, "applies only to %s storage, not %q", KindCompressed, s.Storage)
	case f.Compress != nil && !*f.Compress:
		v.add(fsPath, "needs the field compressed; drop \"compress\": false")
	case fs.K < 2:
		v.add(fsPath+".k", "must be at least 2, got %d", fs.K)
	case fs.Axis < 0 || fs.Axis >= len(f.Shape):
		v.add(fsPath+".axis", "must name a dimension of shape %v (0 to %d), got %d", f.Shape, len(f.Shape)-1, fs.Axis)
	case f.Shape[fs.Axis] != fs.K:
		v.add(fsPath+".k", "is %d but shape %v has %d frames along axis %d", fs.K, f.Shape, f.Shape[fs.Axis], fs.Axis)
	case s.Compression != nil && s.Compression.ChunkLen < fs.K:
		v.add(fsPath+".k", "is %d but compression.chunk_len is %d; a chunk must hold at least k rows", fs.K, s.Compression.ChunkLen)
	}
}

// Compressed reports whether f is kept in compressed chunks in a buffer with
// this spec (which must have its defaults filled in).
func (s Spec) Compressed(f Field) bool {
	if s.Storage != KindCompressed {
		return false
	}
	switch f.Name {
	case "next.done", "next.terminated", "next.truncated":
		return false
	}
	if f.Mutable {
		return false
	}
	if f.Compress != nil {
		return *f.Compress
	}
	return f.FrameStack != nil || f.RowBytes() >= compressMinBytes
}

// field checks one field. The capacity is needed because the column for the
// field must be addressable in int64 bytes.
func (v *specValidator) field(path string, f Field, capacity int64, capacityOK bool) {
	if msg := v.nameProblem(f.Name); msg != "" {
		v.add(path, "%s", msg)
	}

	dtypePath, shapePath := path+".dtype", path+".shape"
	switch {
	case f.DType == 0:
		v.add(dtypePath, "is required (one of %s)", validDTypeNames())
	case !f.DType.Valid():
		v.add(dtypePath, "unknown %s (valid dtypes: %s)", f.DType, validDTypeNames())
	}

	shapeOK := true
	if len(f.Shape) > specMaxDims {
		v.add(shapePath, "has %d dimensions; at most %d are allowed", len(f.Shape), specMaxDims)
		shapeOK = false
	}
	for i, d := range f.Shape {
		if d < 1 {
			v.add(fmt.Sprintf("%s[%d]", shapePath, i), "dimension must be at least 1, got %d", d)
			shapeOK = false
		}
	}
	if shapeOK {
		// Multiply with an overflow guard: the shape comes from a client and
		// its product may not fit in an int at all.
		size := max(int64(f.DType.Size()), 1)
		rowBytes := size
		for _, d := range f.Shape {
			if int64(d) > specMaxRowBytes/rowBytes {
				rowBytes = -1
				break
			}
			rowBytes *= int64(d)
		}
		switch {
		case rowBytes < 0:
			v.add(shapePath, "a row of shape %v exceeds the %d MiB row limit", f.Shape, specMaxRowBytes>>20)
		case capacityOK && rowBytes > math.MaxInt64/capacity:
			v.add(shapePath, "capacity %d times %d bytes per row overflows int64", capacity, rowBytes)
		}
	}

	switch f.Name {
	case "next.done", "next.terminated", "next.truncated":
		// Episode boundaries are read as one flag per row by the samplers.
		if f.DType.Valid() && f.DType != Bool {
			v.add(dtypePath, "%s must be bool, got %s", f.Name, f.DType)
		}
		if len(f.Shape) != 0 {
			v.add(shapePath, "%s must be a scalar (shape []), got %v", f.Name, f.Shape)
		}
	}

}

// nameProblem returns why name cannot be a field name, or "" if it can.
// Names are restricted to dotted identifiers so that they can double as
// file names and as Python attribute paths; reserved names belong to the
// columns and sample keys the buffer adds itself.
// ReservedNewField is a field name new buffers may not use: extends give
// each row's policy version under it. Buffers created before it was
// reserved keep such a field.
const ReservedNewField = "policy_version"

// ReservedNewSampleKeys are keys sample answers may add (return_prob's
// prob, a sharded client's shard): new buffers may not name a field so;
// buffers created before keep such a field, and return_prob is refused
// on them.
var ReservedNewSampleKeys = []string{"prob", "shard"}

func (specValidator) nameProblem(name string) string {
	if name == "" {
		return "field name must not be empty"
	}
	if len(name) > specMaxFieldNameLen {
		return fmt.Sprintf("field name is %d bytes long; at most %d are allowed", len(name), specMaxFieldNameLen)
	}
	for part := range strings.SplitSeq(name, ".") {
		if !isSpecIdentifier(part) {
			return fmt.Sprintf("invalid field name %q: each dot-separated part must match [A-Za-z_][A-Za-z0-9_]*", name)
		}
	}
	switch name {
	case "seq", "traj_id", "step", "prev_seq", "next_seq", "env", "weight", "mask",
		"slice_end", "steps_to_next_obs", "gamma", "epoch":
		return fmt.Sprintf("field name %q is reserved for a column the buffer adds itself", name)
	}
	if strings.HasSuffix(name, "_valid") {
		return fmt.Sprintf("field name %q is reserved: names ending in _valid are validity masks the buffer adds itself", name)
	}
	if strings.HasPrefix(name, "next.original_") {
		return fmt.Sprintf("field name %q is reserved: names starting with next.original_ are kept for unmodified copies of transformed fields", name)
	}
	return ""
}

// isSpecIdentifier reports whether s matches [A-Za-z_][A-Za-z0-9_]*.
func isSpecIdentifier(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// MarshalJSON writes the canonical JSON form of s: compact, with top-level
// keys in a fixed order, fields in declaration order and optional sections
// (priority, durability, compression) only when set. Being canonical means
// that marshaling a decoded spec again gives identical bytes, which lets
// specs be compared and stored byte for byte. s is written as it is; call
// WithDefaults first to spell out defaults.
func (s Spec) MarshalJSON() ([]byte, error) {
	var e specEncoder
	e.raw(`{"capacity":`)
	e.raw(strconv.FormatInt(s.Capacity, 10))
	e.raw(`,"storage":`)
	e.str(string(s.Storage))
	e.raw(`,"fields":{`)
	for i, f := range s.Fields {
		if i > 0 {
			e.raw(",")
		}
		e.str(f.Name)
		e.raw(`:{"dtype":`)
		e.value(f.DType)
		e.raw(`,"shape":[`)
		for j, d := range f.Shape {
			if j > 0 {
				e.raw(",")
			}
			e.raw(strconv.Itoa(d))
		}
		e.raw("]")
		if f.Compress != nil {
			e.raw(`,"compress":`)
			e.raw(strconv.FormatBool(*f.Compress))
		}
		if f.Mutable {
			e.raw(`,"mutable":true`)
		}
		if f.FrameStack != nil {
			e.raw(`,"frame_stack":{"k":`)
			e.raw(strconv.Itoa(f.FrameStack.K))
			e.raw(`,"axis":`)
			e.raw(strconv.Itoa(f.FrameStack.Axis))
			e.raw("}")
		}
		e.raw("}")
	}
	e.raw(`},"compact_obs":`)
	e.raw(strconv.FormatBool(s.CompactObs))
	e.raw(`,"obs_keys":[`)
	for i, k := range s.ObsKeys {
		if i > 0 {
			e.raw(",")
		}
		e.str(k)
	}
	e.raw("]")
	if p := s.Priority; p != nil {
		e.raw(`,"priority":{"alpha":`)
		e.value(p.Alpha)
		e.raw(`,"eps":`)
		e.value(p.Eps)
		e.raw("}")
	}
	if s.Durability != "" {
		e.raw(`,"durability":`)
		e.str(string(s.Durability))
	}
	if s.RowMetaLayout != "" {
		e.raw(`,"row_meta":`)
		e.str(string(s.RowMetaLayout))
	}
	if c := s.Compression; c != nil {
		e.raw(`,"compression":{"codec":`)
		e.str(c.Codec)
		e.raw(`,"level":`)
		e.raw(strconv.Itoa(c.Level))
		e.raw(`,"chunk_len":`)
		e.raw(strconv.Itoa(c.ChunkLen))
		e.raw(`,"delta":`)
		e.raw(strconv.FormatBool(c.Delta))
		e.raw(`,"cache_mib":`)
		e.raw(strconv.Itoa(c.CacheMiB))
		e.raw("}")
	}
	if r := s.RateLimit; r != nil {
		e.raw(`,"rate_limit":`)
		e.rateLimit(r)
	}
	e.raw("}")
	if e.err != nil {
		return nil, fmt.Errorf("storage: marshal spec: %w", e.err)
	}
	return e.buf.Bytes(), nil
}

// MarshalRateLimit returns the JSON form of a rate limit, as it appears
// under "rate_limit" in a spec (JSON null for nil).
func MarshalRateLimit(r *ratelimit.Params) ([]byte, error) {
	if r == nil {
		return []byte("null"), nil
	}
	var e specEncoder
	e.rateLimit(r)
	if e.err != nil {
		return nil, fmt.Errorf("storage: marshal rate_limit: %w", e.err)
	}
	return e.buf.Bytes(), nil
}

func (e *specEncoder) rateLimit(r *ratelimit.Params) {
	e.raw("{")
	if r.HasRatio() {
		e.raw(`"samples_per_insert":`)
		e.value(r.SamplesPerInsert)
		e.raw(",")
	}
	e.raw(`"min_size":`)
	e.raw(strconv.FormatInt(r.MinSize, 10))
	if r.ErrorBuffer != 0 {
		e.raw(`,"error_buffer":`)
		e.value(r.ErrorBuffer)
	}
	e.raw("}")
}

// specEncoder builds JSON by hand so that key order is under our control,
// keeping the first error so that the writing code can stay linear.
type specEncoder struct {
	buf bytes.Buffer
	err error
}

func (e *specEncoder) raw(s string) {
	e.buf.WriteString(s)
}

func (e *specEncoder) str(s string) {
	e.value(s)
}

// value writes v with encoding/json, which gives strings proper escaping and
// floats their shortest exactly-round-tripping form, and rejects NaN.
func (e *specEncoder) value(v any) {
	if e.err != nil {
		return
	}
	b, err := json.Marshal(v)
	if err != nil {
		e.err = err
		return
	}
	e.buf.Write(b)
}

// UnmarshalJSON decodes a spec without filling defaults or validating it; use
// ParseSpec for input from clients. Decoding is strict, because a misspelt
// key silently ignored would give the client a buffer it did not ask for:
// unknown and duplicate keys are errors naming the key. The order of the
// "fields" object is kept in Fields. Priority keys that are left out take
// their DefaultPriority values here, since a zero alpha is meaningful. JSON
// null leaves s unchanged, following encoding/json's convention. Errors are
// *SpecError values.
func (s *Spec) UnmarshalJSON(data []byte) error {
	if string(bytes.TrimSpace(data)) == "null" {
		return nil
	}
	d := specDecoder{dec: json.NewDecoder(bytes.NewReader(data))}
	var out Spec
	present, err := d.object("", "key", func(key, path string) error {
		switch key {
		case "capacity":
			return d.value(path, "an integer", &out.Capacity)
		case "storage":
			return d.value(path, "a string", &out.Storage)
		case "fields":
			return d.fields(path, &out.Fields)
		case "compact_obs":
			return d.value(path, "a boolean", &out.CompactObs)
		case "obs_keys":
			return d.value(path, "an array of strings", &out.ObsKeys)
		case "priority":
			return d.priority(path, &out.Priority)
		case "durability":
			return d.value(path, "a string", &out.Durability)
		case "compression":
			return d.compression(path, &out.Compression)
		case "row_meta":
			return d.value(path, "a string", &out.RowMetaLayout)
		case "rate_limit":
			return d.rateLimit(path, &out.RateLimit)
		default:
			return d.unknownKey(path)
		}
	})
	if err != nil {
		return err
	}
	if !present {
		return &SpecError{Msg: "must be a JSON object"}
	}
	if _, err := d.dec.Token(); err != io.EOF {
		return &SpecError{Msg: "unexpected data after the spec object"}
	}
	*s = out
	return nil
}

// specDecoder walks a spec with json.Decoder tokens, which is what lets it
// keep the order of the fields object and notice duplicate keys.
type specDecoder struct {
	dec *json.Decoder
}

// object reads one JSON object, calling fn with each key and its path while
// the decoder is positioned at the key's value; fn must consume that value.
// A JSON null reads as an absent object (present is false). what names the
// keys in duplicate-key errors.
func (d specDecoder) object(path, what string, fn func(key, path string) error) (present bool, err error) {
	tok, err := d.dec.Token()
	if err != nil {
		return false, d.syntaxError(path, err)
	}
	if tok == nil {
		return false, nil
	}
	if delim, ok := tok.(json.Delim); !ok || delim != '{' {
		return false, &SpecError{Path: path, Msg: "must be a JSON object, not " + d.describe(tok)}
	}
	seen := make(map[string]bool)
	for d.dec.More() {
		tok, err := d.dec.Token()
		if err != nil {
			return false, d.syntaxError(path, err)
		}
		// Inside an object the decoder only yields string keys.
		key := tok.(string)
		keyPath := specJoinPath(path, key)
		if seen[key] {
			return false, &SpecError{Path: keyPath, Msg: "duplicate " + what}
		}
		seen[key] = true
		if err := fn(key, keyPath); err != nil {
			return false, err
		}
	}
	if _, err := d.dec.Token(); err != nil { // the closing brace
		return false, d.syntaxError(path, err)
	}
	return true, nil
}

// value decodes the next JSON value into v, where want describes the
// expected JSON type for error messages. JSON null leaves v unchanged.
func (d specDecoder) value(path, want string, v any) error {
	err := d.dec.Decode(v)
	if err == nil {
		return nil
	}
	if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
		return &SpecError{Path: path, Msg: fmt.Sprintf("must be %s, not %s", want, te.Value)}
	}
	return d.syntaxError(path, err)
}

func (d specDecoder) syntaxError(path string, err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return &SpecError{Path: path, Msg: "unexpected end of JSON input", Err: err}
	}
	return &SpecError{Path: path, Msg: "malformed JSON: " + err.Error(), Err: err}
}

func (specDecoder) unknownKey(path string) error {
	return &SpecError{Path: path, Msg: "unknown key"}
}

// describe names the JSON type of a token for error messages.
func (specDecoder) describe(tok json.Token) string {
	switch t := tok.(type) {
	case json.Delim:
		if t == '[' {
			return "an array"
		}
		return "an object"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	default:
		return "a number"
	}
}

// fields decodes the "fields" object, one Field per key in order.
func (d specDecoder) fields(path string, out *[]Field) error {
	fields := []Field{}
	present, err := d.object(path, "field name", func(name, _ string) error {
		f, err := d.field(specFieldPath(name), name)
		if err != nil {
			return err
		}
		fields = append(fields, f)
		return nil
	})
	if err != nil {
		return err
	}
	if present {
		*out = fields
	}
	return nil
}

func (d specDecoder) field(path, name string) (Field, error) {
	f := Field{Name: name}
	_, err := d.object(path, "key", func(key, keyPath string) error {
		switch key {
		case "dtype":
			var dt *string
			if err := d.value(keyPath, "a string", &dt); err != nil {
				return err
			}
			if dt == nil {
				return nil
			}
			v, err := ParseDType(*dt)
			if err != nil {
				return &SpecError{Path: keyPath, Msg: fmt.Sprintf("unknown dtype %q (valid dtypes: %s)", *dt, validDTypeNames())}
			}
			f.DType = v
			return nil
		case "shape":
			return d.value(keyPath, "an array of integers", &f.Shape)
		case "compress":
			return d.value(keyPath, "a boolean", &f.Compress)
		case "frame_stack":
			return d.frameStack(keyPath, &f.FrameStack)
		case "mutable":
			return d.value(keyPath, "a boolean", &f.Mutable)
		default:
			return d.unknownKey(keyPath)
		}
	})
	return f, err
}

func (d specDecoder) frameStack(path string, out **FrameStack) error {
	var fs FrameStack
	present, err := d.object(path, "key", func(key, keyPath string) error {
		switch key {
		case "k":
			return d.value(keyPath, "an integer", &fs.K)
		case "axis":
			return d.value(keyPath, "an integer", &fs.Axis)
		default:
			return d.unknownKey(keyPath)
		}
	})
	if err != nil {
		return err
	}
	if present {
		*out = &fs
	}
	return nil
}

func (d specDecoder) priority(path string, out **PriorityOptions) error {
	p := DefaultPriority()
	present, err := d.object(path, "key", func(key, keyPath string) error {
		switch key {
		case "alpha":
			return d.value(keyPath, "a number", &p.Alpha)
		case "eps":
			return d.value(keyPath, "a number", &p.Eps)
		default:
			return d.unknownKey(keyPath)
		}
	})
	if err != nil {
		return err
	}
	if present {
		*out = &p
	} else {
		*out = nil
	}
	return nil
}

// ParseRateLimit decodes a rate limit object as it appears under
// "rate_limit" in a spec (JSON null: none), strictly like a spec: unknown
// and duplicate keys are *SpecError values naming the key. It does not
// validate the values; Spec.Validate and Buffer.SetRateLimit do.
func ParseRateLimit(data []byte) (*ratelimit.Params, error) {
	d := specDecoder{dec: json.NewDecoder(bytes.NewReader(data))}
	var out *ratelimit.Params
	if err := d.rateLimit("rate_limit", &out); err != nil {
		return nil, err
	}
	if _, err := d.dec.Token(); err != io.EOF {
		return nil, &SpecError{Path: "rate_limit", Msg: "unexpected data after the rate_limit object"}
	}
	return out, nil
}

func (d specDecoder) rateLimit(path string, out **ratelimit.Params) error {
	// min_size defaults to 1: the least any sampler needs.
	r := ratelimit.Params{MinSize: 1}
	var spi *float64
	present, err := d.object(path, "key", func(key, keyPath string) error {
		switch key {
		case "samples_per_insert":
			return d.value(keyPath, "a number", &spi)
		case "min_size":
			return d.value(keyPath, "an integer", &r.MinSize)
		case "error_buffer":
			return d.value(keyPath, "a number", &r.ErrorBuffer)
		default:
			return d.unknownKey(keyPath)
		}
	})
	if err != nil {
		return err
	}
	if spi != nil {
		// Zero means "no ratio" in Params; said out loud it is a mistake.
		if *spi == 0 {
			return &SpecError{Path: specJoinPath(path, "samples_per_insert"), Msg: "must be a finite number > 0 (leave it out for a limiter on min_size only), got 0"}
		}
		r.SamplesPerInsert = *spi
	}
	if present {
		*out = &r
	} else {
		*out = nil
	}
	return nil
}

func (d specDecoder) compression(path string, out **CompressionOptions) error {
	// Like priority, keys left out take defaults now, so that a client can
	// change only the level.
	var c CompressionOptions
	present, err := d.object(path, "key", func(key, keyPath string) error {
		switch key {
		case "codec":
			return d.value(keyPath, "a string", &c.Codec)
		case "level":
			return d.value(keyPath, "an integer", &c.Level)
		case "chunk_len":
			return d.value(keyPath, "an integer", &c.ChunkLen)
		case "delta":
			return d.value(keyPath, "a boolean", &c.Delta)
		case "cache_mib":
			return d.value(keyPath, "an integer", &c.CacheMiB)
		default:
			return d.unknownKey(keyPath)
		}
	})
	if err != nil {
		return err
	}
	if present {
		c.fillDefaults()
		*out = &c
	} else {
		*out = nil
	}
	return nil
}
