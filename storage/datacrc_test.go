package storage

import (
	"math/rand/v2"
	"testing"
)

// TestWriteRowDataCRC checks that the data checksum a writer puts in each
// row's record is the one recovery computes from the stored columns
// (rowCRC, a checksum call per field): writeRow stages the fields side by
// side and checksums them in as few calls as fit its scratch, and that must
// not change a single checksum, whatever the fields' sizes and order. For
// rows.meta version 2 (row_meta "runs"), whose extends copy a column at a
// time and stage rows of up to crcScratchSize checksummed bytes a column at
// a time (stageRunRows) and larger ones row by row, the reopened buffer
// must recover every row and Verify find nothing: each checksum was checked
// on the way.
func TestWriteRowDataCRC(t *testing.T) {
	flags := []Field{
		{Name: "next.done", DType: Bool, Shape: []int{}},
		{Name: "next.terminated", DType: Bool, Shape: []int{}},
		{Name: "next.truncated", DType: Bool, Shape: []int{}},
	}
	cases := []struct {
		name   string
		fields []Field
	}{
		{"small fields", []Field{
			{Name: "observation", DType: Float32, Shape: []int{4}},
			{Name: "action", DType: Int64, Shape: []int{}},
			{Name: "next.reward", DType: Float32, Shape: []int{}},
		}},
		{"odd widths", []Field{
			{Name: "observation", DType: Float16, Shape: []int{3}},
			{Name: "action", DType: Int8, Shape: []int{5}},
			{Name: "next.reward", DType: Float64, Shape: []int{3}},
		}},
		{"large field between small ones", []Field{
			{Name: "action", DType: Int64, Shape: []int{}},
			{Name: "observation", DType: Uint8, Shape: []int{40, 40}},
			{Name: "next.reward", DType: Float32, Shape: []int{}},
		}},
		{"small fields past the scratch", []Field{
			{Name: "observation", DType: Float32, Shape: []int{50}},
			{Name: "goal", DType: Float32, Shape: []int{50}},
			{Name: "action", DType: Float32, Shape: []int{20}},
			{Name: "next.reward", DType: Float32, Shape: []int{}},
		}},
		{"a field exactly the scratch's size", []Field{
			{Name: "observation", DType: Uint8, Shape: []int{crcScratchSize}},
			{Name: "action", DType: Int64, Shape: []int{}},
			{Name: "next.reward", DType: Float32, Shape: []int{}},
		}},
		{"a row's checksummed bytes exactly the scratch's size", []Field{
			{Name: "observation", DType: Uint8, Shape: []int{crcScratchSize - 3}}, // and the three flags
		}},
		{"mutable field left out", []Field{
			{Name: "observation", DType: Float32, Shape: []int{4}},
			{Name: "action", DType: Int64, Shape: []int{}},
			{Name: "next.reward", DType: Float32, Shape: []int{}},
			{Name: "td_error", DType: Float32, Shape: []int{}, Mutable: true},
		}},
	}
	for _, layout := range []RowMetaLayout{RowMetaPerRow, RowMetaRuns} {
		for _, tc := range cases {
			t.Run(string(layout)+"/"+tc.name, func(t *testing.T) {
				testWriteRowDataCRC(t, layout, append(append([]Field(nil), tc.fields...), flags...))
			})
		}
	}
}

func testWriteRowDataCRC(t *testing.T, layout RowMetaLayout, fields []Field) {
	const capacity, rows = 64, 100 // the ring wraps within the extend
	spec := Spec{
		Capacity:   capacity,
		Storage:    KindMemmap,
		Fields:     fields,
		Durability: DurabilityNone,
		// Version 1 records carry the data checksum this test
		// reads; version 2 folds it into the record's, which
		// recovery checks.
		RowMetaLayout: layout,
	}
	s := openStore(t, t.TempDir())
	b := mustCreate(t, s, "crc", spec)
	rng := rand.New(rand.NewPCG(1, 2))
	batch := &Batch{Rows: rows, Fields: map[string][]byte{}}
	for _, f := range spec.Fields {
		v := make([]byte, rows*f.RowBytes())
		for i := range v {
			v[i] = byte(rng.Uint32())
		}
		if isFlagField(f.Name) {
			clear(v) // no row done: every row is one trajectory
		}
		batch.Fields[f.Name] = v
	}
	mustExtend(t, b, "", batch)
	for seq := int64(rows - capacity); seq < rows && layout == RowMetaPerRow; seq++ {
		slot := seq % capacity
		r, ok := decodeRecord(b.rec(slot), new([recordSize]byte))
		if !ok || r.Seq != seq {
			t.Fatalf("seq %d: record ok=%v seq %d", seq, ok, r.Seq)
		}
		if want, _ := b.rowCRC(seq, r.Flags, func(uint32) bool { return true }); r.DataCRC != want {
			t.Errorf("seq %d: record's data checksum %08x, the stored fields' %08x", seq, r.DataCRC, want)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// And the reopened buffer recovers every row (recovery checks
	// the same checksums).
	s = openStore(t, s.Dir())
	defer s.Close()
	b, err := s.Buffer("crc")
	if err != nil {
		t.Fatal(err)
	}
	if got := b.liveRows(); got != capacity {
		t.Errorf("after reopen: %d rows, want %d", got, capacity)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := Verify(s.Dir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Errorf("verify: %+v", rep)
	}
}
