package collector

import (
	"fmt"
	"slices"

	"github.com/rbdb/rbd/collector/envs"
	"github.com/rbdb/rbd/storage"
)

// SpecOptions are the buffer settings BufferSpec does not take from the
// env.
type SpecOptions struct {
	// Capacity is the ring size in rows.
	Capacity int64
	// Storage is the storage kind; "" means memmap.
	Storage storage.Kind
	// CompactObs leaves next.observation out of the fields: rbd rebuilds
	// it at sample time (the collector must then run with CompactObs).
	CompactObs bool
	// Priority turns prioritised sampling on with the default alpha and
	// eps.
	Priority bool
	// Durability is "" (the storage default) or a durability mode.
	Durability storage.Durability
	// RowMeta is the buffer's row_meta: "" for the default of its
	// storage kind (memory: "row"; memmap: "runs", rows.meta format
	// version 2), or a storage.RowMetaLayout.
	RowMeta storage.RowMetaLayout
	// Compression configures a compressed buffer; nil means the defaults.
	Compression *storage.CompressionOptions
	// FrameDedup declares the frame stack of stacked pixel observations
	// (catch with a stack: [K, 84, 84], axis 0), so that a compressed
	// buffer stores each frame once. It needs Storage compressed and is
	// ignored for envs without a stack.
	FrameDedup bool
	// RecurrentState, if > 0, adds the field "recurrent_state" float32
	// [RecurrentState] for a RecurrentPolicy's states (see
	// DefaultStateField and docs/recurrent.md); 0 adds nothing.
	RecurrentState int
}

// BufferSpec is the spec of a buffer holding env's steps as the collector
// writes them (TorchRL's layout, part A5 of the semantics):
//
//	observation        ObsDType ObsShape
//	action             int64 [] (discrete) or float32 ActionShape
//	next.reward        float32 []
//	next.done          bool []
//	next.terminated    bool []
//	next.truncated     bool []
//	next.observation   ObsDType ObsShape   (not with CompactObs)
//	recurrent_state    float32 [H] mutable (with RecurrentState H)
func BufferSpec(env envs.Spec, o SpecOptions) storage.Spec {
	obsDT, err := storage.ParseDType(env.ObsDType)
	if err != nil {
		panic(fmt.Sprintf("collector: env %s: %v", env.Name, err))
	}
	act := storage.Field{Name: "action", DType: storage.Int64, Shape: []int{}}
	if !env.Discrete() {
		act = storage.Field{Name: "action", DType: storage.Float32, Shape: slices.Clone(env.ActionShape)}
	}
	kind := o.Storage
	if kind == "" {
		kind = storage.KindMemmap
	}
	s := storage.Spec{
		Capacity: o.Capacity, Storage: kind, CompactObs: o.CompactObs, ObsKeys: []string{"observation"},
		Durability: o.Durability, Compression: o.Compression, RowMetaLayout: o.RowMeta,
		Fields: []storage.Field{
			{Name: "observation", DType: obsDT, Shape: slices.Clone(env.ObsShape)},
			act,
			{Name: "next.reward", DType: storage.Float32, Shape: []int{}},
			{Name: "next.done", DType: storage.Bool, Shape: []int{}},
			{Name: "next.terminated", DType: storage.Bool, Shape: []int{}},
			{Name: "next.truncated", DType: storage.Bool, Shape: []int{}},
		},
	}
	if o.FrameDedup && env.FrameStack > 1 {
		s.Fields[0].FrameStack = &storage.FrameStack{K: env.FrameStack, Axis: 0}
	}
	if !o.CompactObs {
		s.Fields = append(s.Fields, storage.Field{Name: "next.observation", DType: obsDT, Shape: slices.Clone(env.ObsShape)})
	}
	if o.RecurrentState > 0 {
		// Mutable, so a learner can write back the states it recomputed.
		s.Fields = append(s.Fields, storage.Field{Name: DefaultStateField, DType: storage.Float32, Shape: []int{o.RecurrentState}, Mutable: true})
	}
	if o.Priority {
		p := storage.DefaultPriority()
		s.Priority = &p
	}
	return s
}
