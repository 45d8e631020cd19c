package client

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/rbdb/rbd/ratelimit"
)

// Info is a buffer's state as the server reports it (GET
// /v1/buffers/{name}). It mirrors storage.Info.
type Info struct {
	Name string `json:"name"`
	// Spec is the buffer's spec with every default filled in.
	Spec Spec `json:"spec"`
	// Size is the number of live rows (at most Spec.Capacity).
	Size int64 `json:"size"`
	// WriteCount is the number of rows ever written, the next seq.
	WriteCount int64 `json:"write_count"`
	// Trajectories counts live trajectories; OpenTrajectories those a
	// stream may still extend.
	Trajectories     int `json:"trajectories"`
	OpenTrajectories int `json:"open_trajectories"`
	// Bytes compares, per field, what a plain layout would take with what
	// is stored.
	Bytes         map[string]FieldBytes `json:"bytes"`
	SamplesServed int64                 `json:"samples_served"`
	// DurableSeq is the durable watermark: rows below it are on stable
	// storage.
	DurableSeq  int64 `json:"durable_seq"`
	Streams     int   `json:"streams"`
	Holes       int64 `json:"holes"`
	DamagedRows int   `json:"damaged_rows"`
	// DiskBytes is the space the buffer's files take (0 for memory buffers).
	DiskBytes int64 `json:"disk_bytes"`
	// RowMetaBytes is what one slot's row metadata takes: 64 for the
	// file record of compressed buffers and memmap buffers with
	// "row_meta": "row" (16 for a memmap buffer with "row_meta": "runs",
	// the default of new memmap buffers), the 32-byte record (16 with
	// "row_meta": "runs", run records not counted) plus row-group padding
	// for memory buffers.
	RowMetaBytes int64 `json:"row_meta_bytes"`
	// RunRecords is how many run records a buffer with "row_meta": "runs"
	// holds in memory (Size / RunRecords rows share each).
	RunRecords int64 `json:"run_records,omitempty"`
	// ChunkCache counts decoded-chunk cache lookups of compressed buffers.
	ChunkCache *CacheStats `json:"chunk_cache,omitempty"`
	// RateLimit is the rate limiter's live state (nil without one).
	RateLimit *ratelimit.State `json:"rate_limit,omitempty"`
	// PolicyVersions says which policy versions produced the live rows.
	PolicyVersions PolicyVersions `json:"policy_versions"`
	// Sampling is what uniform and prioritized draws are taken over; a
	// Sharded client splits batches across shards by it.
	Sampling SamplingInfo `json:"sampling"`
}

// SamplingInfo mirrors storage.SamplingInfo: rows and sums of sampling
// priorities q over every live row, and over the rows whose next
// observation is known (what compact_obs samples with next_state draw
// among), and the smallest q (priority figures are 0 without priorities).
type SamplingInfo struct {
	Rows                   int64   `json:"rows"`
	NextKnownRows          int64   `json:"next_known_rows"`
	PriorityTotal          float64 `json:"priority_total"`
	NextKnownPriorityTotal float64 `json:"next_known_priority_total"`
	PriorityMin            float64 `json:"priority_min"`
	// Slices is set by InfoForSlices: the trajectories slices are drawn
	// among.
	Slices *SliceFigures `json:"slices,omitempty"`
}

// SliceFigures mirrors storage.SliceFigures.
type SliceFigures struct {
	SliceLen     int   `json:"slice_len"`
	Trajectories int64 `json:"trajectories"`
	AtLeast      int64 `json:"trajectories_at_least"`
}

// PolicyVersions says which policy versions produced a buffer's live rows
// (it mirrors storage.PolicyVersions): the newest version ever written, the
// live rows' smallest and largest, and live rows per version, newest first
// (at most 32 versions; OlderRows sums the rest).
type PolicyVersions struct {
	Newest int64 `json:"newest"`
	Min    int64 `json:"min"`
	Max    int64 `json:"max"`
	Rows   []struct {
		Version int64 `json:"version"`
		Rows    int64 `json:"rows"`
	} `json:"rows"`
	OlderRows int64 `json:"older_rows"`
}

// CacheStats counts lookups in a compressed buffer's decoded-chunk cache.
type CacheStats struct {
	Hits   int64 `json:"hits"`
	Misses int64 `json:"misses"`
	Bytes  int64 `json:"bytes"`
}

// FieldBytes is one field's logical (plain layout) and stored size.
type FieldBytes struct {
	Logical int64 `json:"logical"`
	Stored  int64 `json:"stored"`
}

// ExtendResult is the answer to Extend. It mirrors storage.ExtendResult.
type ExtendResult struct {
	// FirstSeq is the seq of the request's first row.
	FirstSeq int64 `json:"first_seq"`
	// Rows is the number of rows in the request.
	Rows int `json:"rows"`
	// WriteCount is the buffer's write count after the request.
	WriteCount int64 `json:"write_count"`
}

// SampleRequest is the body of a sample request. It mirrors
// rbd.SampleRequest field for field (same JSON names); zero values mean
// the server's documented defaults.
type SampleRequest struct {
	// BatchSize is the number of rows (transition samplers) or
	// NumSlices*SliceLen (slice samplers).
	BatchSize int `json:"batch_size,omitempty"`
	// Sampler is "uniform" (the default when empty),
	// "without_replacement", "prioritized", "slice",
	// "slice_without_replacement" or "prioritized_slice".
	Sampler string `json:"sampler,omitempty"`
	// Seed makes the sample reproducible for the same store state; nil
	// draws a random one.
	Seed *uint64 `json:"seed,omitempty"`
	// Keys lists the fields to return; nil means every stored field (plus
	// next.<k> when next-state reconstruction is on).
	Keys []string `json:"keys,omitempty"`
	// NextState turns next-state reconstruction on or off; nil means on
	// for compact_obs buffers.
	NextState *bool `json:"next_state,omitempty"`
	// NStep asks for n-step returns.
	NStep *NStep `json:"n_step,omitempty"`
	// NumSlices and SliceLen shape slice samples (give two of BatchSize,
	// NumSlices and SliceLen).
	NumSlices int `json:"num_slices,omitempty"`
	SliceLen  int `json:"slice_len,omitempty"`
	// StrictLength (nil means true) draws slices only from trajectories
	// long enough; false pads short slices and returns a mask.
	StrictLength *bool `json:"strict_length,omitempty"`
	// Beta is the importance-weight exponent (nil means 0.4).
	Beta *float64 `json:"beta,omitempty"`
	// Consumer names the epoch of without-replacement samplers.
	Consumer string `json:"consumer,omitempty"`
	// IncludeIncomplete lets transition samplers return rows whose next
	// observation is not known yet, flagged by next.<k>_valid = false.
	IncludeIncomplete bool `json:"include_incomplete,omitempty"`
	// DropLast drops the short last batch of a without-replacement epoch.
	DropLast bool `json:"drop_last,omitempty"`
	// Fill is the value of unknown next observations: "zero" (default) or
	// "nan".
	Fill string `json:"fill,omitempty"`
	// TimeoutMS is how long the server waits for data that can satisfy
	// the request before answering 503 not_ready (0: answer at once). The
	// server caps it; the context passed to Sample should allow for it.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// MinPolicyVersion, when set, makes samplers return only rows whose
	// policy_version is at least this (slice samplers: slices whose first
	// row is); Ptr(v).
	MinPolicyVersion *int64 `json:"min_policy_version,omitempty"`
	// ReturnProb adds "prob" (each row's probability of being drawn) and
	// the metadata size, priority_total and priority_min: what a sharded
	// client combines shards with. Uniform and prioritized samplers only.
	ReturnProb bool `json:"return_prob,omitempty"`
}

// NStep asks for n-step returns with discount Gamma. It mirrors rbd.NStep.
type NStep struct {
	N     int     `json:"n"`
	Gamma float64 `json:"gamma"`
}

// Ptr returns a pointer to v, for the optional fields of SampleRequest:
// Seed: client.Ptr[uint64](7), NextState: client.Ptr(false).
func Ptr[T any](v T) *T { return &v }

// Spec describes a buffer (the body of PUT /v1/buffers/{name}). It is a
// light mirror of storage.Spec: strings instead of typed enums, and no
// validation, which is the server's job. Empty or nil settings are left
// out of the JSON, so the server fills its defaults (storage "memmap",
// obs_keys ["observation"], durability "flush").
//
// Its JSON keeps Fields in order (the "fields" object lists them as
// given). Decoding ignores keys it does not know, so a newer server's Info
// still decodes.
type Spec struct {
	// Capacity is the ring size in rows.
	Capacity int64
	// Storage is "memory", "memmap" or "compressed"; "" means memmap.
	Storage string
	// Fields are the columns, in order.
	Fields []Field
	// CompactObs stores each observation once and rebuilds next.<k> at
	// sample time.
	CompactObs bool
	// ObsKeys names the observation fields; nil means ["observation"].
	ObsKeys []string
	// Priority enables prioritised sampling; nil means off.
	Priority *Priority
	// Durability is "none", "flush" or "fsync"; "" means flush.
	Durability string
	// Compression configures compressed buffers; nil means zstd level 1.
	Compression *Compression
	// RateLimit is the buffer's flow control between actors and learners;
	// nil means none (docs/flow-control.md).
	RateLimit *RateLimit
}

// RateLimit keeps about SamplesPerInsert sampled rows per inserted row,
// within ErrorBuffer either way, once the buffer holds MinSize rows. Zero
// values are left out: no ratio (only MinSize holds), min_size 1.
type RateLimit struct {
	SamplesPerInsert float64 `json:"samples_per_insert,omitempty"`
	MinSize          int64   `json:"min_size,omitempty"`
	ErrorBuffer      float64 `json:"error_buffer,omitempty"`
}

// Field is one column of a Spec.
type Field struct {
	// Name is a TorchRL key flattened with "." (e.g. "next.reward").
	Name string
	// DType is one of bool uint8 int8 int16 int32 int64 float16 bfloat16
	// float32 float64.
	DType string
	// Shape is the per-row shape; empty means a scalar.
	Shape []int
	// Compress opts the field out of (or into) compression; nil means the
	// buffer's default.
	Compress *bool
	// FrameStack stores only the newest frame of a stacked observation.
	FrameStack *FrameStack
	// Mutable lets Client.UpdateFields set the field of rows after they
	// are written (e.g. recurrent states); false keeps rows immutable.
	Mutable bool
}

// Priority configures prioritised sampling. Both values are sent as given:
// use DefaultPriority for the customary 0.6 and 1e-6.
type Priority struct {
	Alpha float64 `json:"alpha"`
	Eps   float64 `json:"eps"`
}

// DefaultPriority returns the server's defaults, alpha 0.6 and eps 1e-6.
func DefaultPriority() *Priority { return &Priority{Alpha: 0.6, Eps: 1e-6} }

// Compression configures the chunks of a compressed buffer; zero values
// take the server's defaults (zstd level 1, chunks of 32 rows, no delta,
// 64 MiB cache).
type Compression struct {
	Codec    string `json:"codec,omitempty"`
	Level    int    `json:"level,omitempty"`
	ChunkLen int    `json:"chunk_len,omitempty"`
	Delta    bool   `json:"delta,omitempty"`
	CacheMiB int    `json:"cache_mib,omitempty"`
}

// FrameStack is the per-field frame stacking option.
type FrameStack struct {
	K    int `json:"k"`
	Axis int `json:"axis"`
}

// fieldJSON is a Field's value in the "fields" object.
type fieldJSON struct {
	DType      string      `json:"dtype"`
	Shape      []int       `json:"shape"`
	Compress   *bool       `json:"compress,omitempty"`
	FrameStack *FrameStack `json:"frame_stack,omitempty"`
	Mutable    bool        `json:"mutable,omitempty"`
}

// MarshalJSON writes the spec with its fields in order, leaving out unset
// optional settings.
func (s Spec) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	put := func(key string, v any) error {
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Quote(key))
		b.WriteByte(':')
		enc, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("spec %s: %w", key, err)
		}
		b.Write(enc)
		return nil
	}
	b.WriteByte('{')
	if err := put("capacity", s.Capacity); err != nil {
		return nil, err
	}
	if s.Storage != "" {
		if err := put("storage", s.Storage); err != nil {
			return nil, err
		}
	}
	b.WriteString(`,"fields":{`)
	for i, f := range s.Fields {
		if i > 0 {
			b.WriteByte(',')
		}
		name, err := json.Marshal(f.Name)
		if err != nil {
			return nil, err
		}
		shape := f.Shape
		if shape == nil {
			shape = []int{}
		}
		v, err := json.Marshal(fieldJSON{DType: f.DType, Shape: shape, Compress: f.Compress, FrameStack: f.FrameStack, Mutable: f.Mutable})
		if err != nil {
			return nil, fmt.Errorf("spec field %q: %w", f.Name, err)
		}
		b.Write(name)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	opt := []struct {
		key string
		set bool
		v   any
	}{
		{"compact_obs", s.CompactObs, s.CompactObs},
		{"obs_keys", s.ObsKeys != nil, s.ObsKeys},
		{"priority", s.Priority != nil, s.Priority},
		{"durability", s.Durability != "", s.Durability},
		{"compression", s.Compression != nil, s.Compression},
		{"rate_limit", s.RateLimit != nil, s.RateLimit},
	}
	for _, o := range opt {
		if o.set {
			if err := put(o.key, o.v); err != nil {
				return nil, err
			}
		}
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// UnmarshalJSON reads a spec, keeping the order of the "fields" object and
// ignoring keys it does not know.
func (s *Spec) UnmarshalJSON(data []byte) error {
	if string(bytes.TrimSpace(data)) == "null" {
		return nil
	}
	var aux struct {
		Capacity    int64           `json:"capacity"`
		Storage     string          `json:"storage"`
		Fields      json.RawMessage `json:"fields"`
		CompactObs  bool            `json:"compact_obs"`
		ObsKeys     []string        `json:"obs_keys"`
		Priority    *Priority       `json:"priority"`
		Durability  string          `json:"durability"`
		Compression *Compression    `json:"compression"`
		RateLimit   *RateLimit      `json:"rate_limit"`
	}
	if err := json.Unmarshal(data, &aux); err != nil {
		return fmt.Errorf("spec: %w", err)
	}
	out := Spec{Capacity: aux.Capacity, Storage: aux.Storage, CompactObs: aux.CompactObs, ObsKeys: aux.ObsKeys,
		Priority: aux.Priority, Durability: aux.Durability, Compression: aux.Compression, RateLimit: aux.RateLimit}
	if len(aux.Fields) > 0 && string(aux.Fields) != "null" {
		dec := json.NewDecoder(bytes.NewReader(aux.Fields))
		if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
			return fmt.Errorf("spec fields: not a JSON object")
		}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return fmt.Errorf("spec fields: %w", err)
			}
			name, _ := tok.(string)
			var f fieldJSON
			if err := dec.Decode(&f); err != nil {
				return fmt.Errorf("spec field %q: %w", name, err)
			}
			out.Fields = append(out.Fields, Field{Name: name, DType: f.DType, Shape: f.Shape, Compress: f.Compress, FrameStack: f.FrameStack, Mutable: f.Mutable})
		}
	}
	*s = out
	return nil
}

// Field returns the named field.
func (s *Spec) Field(name string) (Field, bool) {
	for _, f := range s.Fields {
		if f.Name == name {
			return f, true
		}
	}
	return Field{}, false
}

// CollectorInfo is a server-run collector's live state (GET
// /v1/collectors/{name}); it mirrors server.CollectorInfo.
type CollectorInfo struct {
	Name    string  `json:"name"`
	Env     string  `json:"env"`
	Envs    int     `json:"envs"`
	Buffer  string  `json:"buffer"`
	Policy  string  `json:"policy"`
	Hidden  int     `json:"hidden,omitempty"`
	Epsilon float64 `json:"epsilon"`
	// WeightsVersion counts weight updates; rows are stamped with it.
	WeightsVersion int64 `json:"weights_version"`
	Frames         int64 `json:"frames"`
	Episodes       int64 `json:"episodes"`
	// MeanEpisodeReturn and MeanEpisodeLength are over the last 100
	// episodes.
	MeanEpisodeReturn    float64 `json:"mean_episode_return"`
	MeanEpisodeLength    float64 `json:"mean_episode_length"`
	FramesPerSecond      float64 `json:"frames_per_second"`
	RateLimited          bool    `json:"rate_limited"`
	RateLimitWaitSeconds float64 `json:"rate_limit_wait_seconds"`
}
