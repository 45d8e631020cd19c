package storage

import (
	"errors"
	"slices"
	"testing"
)

// TestPolicyVersions: rows keep the policy version their writer gave, Info
// counts the live rows by version as the ring turns, and a reopened store
// counts them again from its records. Memory buffers run in each row_meta
// layout: evictions read a run layout's versions from its run records.
func TestPolicyVersions(t *testing.T) {
	type layoutCase struct {
		kind   Kind
		layout RowMetaLayout // "": testSpec's
	}
	var cases []layoutCase
	for _, kind := range kinds {
		cases = append(cases, layoutCase{kind: kind})
	}
	for _, l := range []RowMetaLayout{RowMetaRuns, RowMetaStrided} {
		cases = append(cases, layoutCase{kind: KindMemory, layout: l})
	}
	for _, c := range cases {
		kind := c.kind
		name := string(kind)
		if c.layout != "" {
			name += "/" + string(c.layout)
		}
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			s := openStore(t, dir)
			spec := testSpec(kind, 10, false)
			if c.layout != "" {
				spec.RowMetaLayout = c.layout
			}
			b := mustCreate(t, s, "v", spec)
			steps := func(n int, base float32) []row {
				rows := make([]row, n)
				for i := range rows {
					rows[i] = row{val: base + float32(i)}
				}
				return rows
			}
			batch := makeBatch(spec, steps(6, 0), false)
			batch.PolicyVersion = []int64{0, 0, 1, 1, 2, 2}
			mustExtend(t, b, "w", batch)
			got := metas(t, b, 0, 2, 5)
			if got[0].PolicyVersion != 0 || got[1].PolicyVersion != 1 || got[2].PolicyVersion != 2 {
				t.Fatalf("row versions %d %d %d, want 0 1 2", got[0].PolicyVersion, got[1].PolicyVersion, got[2].PolicyVersion)
			}
			want := PolicyVersions{Newest: 2, Min: 0, Max: 2, Rows: []VersionRows{{2, 2}, {1, 2}, {0, 2}}}
			checkVersions(t, b, want)

			// 8 more rows of version 5 overwrite seqs 0-3 (versions 0, 0, 1, 1).
			batch = makeBatch(spec, steps(8, 100), false)
			batch.PolicyVersion = slices.Repeat([]int64{5}, 8)
			mustExtend(t, b, "w", batch)
			want = PolicyVersions{Newest: 5, Min: 2, Max: 5, Rows: []VersionRows{{5, 8}, {2, 2}}}
			checkVersions(t, b, want)

			// Bad versions are refused whole, naming the field and row.
			for _, bad := range [][]int64{{1, -1}, {1, 2, 3}} {
				batch = makeBatch(spec, steps(2, 200), false)
				batch.PolicyVersion = bad
				var be *BatchError
				if _, err := b.Extend("w", batch); !errors.As(err, &be) || be.Field != "policy_version" {
					t.Fatalf("versions %v: %v", bad, err)
				}
			}
			checkVersions(t, b, want)

			s, b = reopenBuffer(t, s, dir, "v")
			if kind == KindMemory {
				want = PolicyVersions{Newest: -1, Min: -1, Max: -1, Rows: []VersionRows{}}
			}
			checkVersions(t, b, want)
		})
	}
}

// TestPolicyVersionsShown: Info lists the newest 32 versions and sums
// the rest, whatever versions writers use.
func TestPolicyVersionsShown(t *testing.T) {
	s := openStore(t, t.TempDir())
	defer s.Close()
	spec := testSpec(KindMemory, 100, false)
	b := mustCreate(t, s, "v", spec)
	rows := make([]row, 40)
	versions := make([]int64, 40)
	for i := range rows {
		rows[i] = row{val: float32(i)}
		versions[i] = int64(1000 - 10*i) // newest first, as a writer going back might
	}
	batch := makeBatch(spec, rows, false)
	batch.PolicyVersion = versions
	mustExtend(t, b, "w", batch)
	info, err := b.Info()
	if err != nil {
		t.Fatal(err)
	}
	pv := info.PolicyVersions
	if pv.Newest != 1000 || pv.Min != 610 || pv.Max != 1000 || len(pv.Rows) != maxVersionsShown || pv.Older != 40-maxVersionsShown {
		t.Fatalf("%+v", pv)
	}
	if pv.Rows[0] != (VersionRows{1000, 1}) || pv.Rows[maxVersionsShown-1] != (VersionRows{690, 1}) {
		t.Fatalf("rows %v", pv.Rows)
	}
}

func checkVersions(t *testing.T, b *Buffer, want PolicyVersions) {
	t.Helper()
	info, err := b.Info()
	if err != nil {
		t.Fatal(err)
	}
	got := info.PolicyVersions
	if got.Newest != want.Newest || got.Min != want.Min || got.Max != want.Max || got.Older != want.Older || !slices.Equal(got.Rows, want.Rows) {
		t.Fatalf("policy versions %+v, want %+v", got, want)
	}
}

// TestPolicyVersionFieldReserved: a new buffer may not declare a field
// named policy_version (extends give the rows' versions under that name).
func TestPolicyVersionFieldReserved(t *testing.T) {
	s := openStore(t, t.TempDir())
	defer s.Close()
	spec := testSpec(KindMemory, 10, false)
	spec.Fields = append(spec.Fields, Field{Name: ReservedNewField, DType: Int64, Shape: []int{}})
	_, _, err := s.CreateBuffer("v", spec)
	var se *SpecError
	if !errors.As(err, &se) || se.Path != "fields.policy_version" || !errors.Is(err, ErrInvalidSpec) {
		t.Fatalf("create with a policy_version field: %v", err)
	}
}

// TestWatermarkBlock: the one-write watermark block is the block
// putWatermark stores, and readWatermark reads it back.
func TestWatermarkBlock(t *testing.T) {
	hdr := make([]byte, headerSize)
	for _, seq := range []int64{0, 1, 6751, 1 << 40} {
		putWatermark(hdr, seq)
		if got := watermarkBlock(seq); !slices.Equal(got, hdr[watermarkOff:watermarkOff+12]) {
			t.Fatalf("seq %d: block % x, putWatermark stores % x", seq, got, hdr[watermarkOff:watermarkOff+12])
		}
		copy(hdr[watermarkOff:], watermarkBlock(seq))
		if got, ok := readWatermark(hdr); !ok || got != seq {
			t.Fatalf("seq %d read back as %d, %v", seq, got, ok)
		}
	}
}
