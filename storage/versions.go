package storage

import (
	"slices"
)

// versionCounts counts live rows by policy version, kept with the index
// (under its lock) so Info and samplers see how old the buffer's data is
// without a scan. Memory is one map entry per distinct live version:
// writers that bump their version per weight update make a few thousand at
// most.
type versionCounts struct {
	rows map[int64]int64
	// newest is the largest version ever written (-1 before any row),
	// evicted rows included: the "now" that ages are measured against.
	newest int64
}

func (v *versionCounts) init() {
	v.rows = map[int64]int64{}
	v.newest = -1
}

func (v *versionCounts) add(version, n int64) {
	v.rows[version] += n
	v.newest = max(v.newest, version)
}

func (v *versionCounts) remove(version, n int64) {
	if v.rows[version] <= n {
		delete(v.rows, version)
		return
	}
	v.rows[version] -= n
}

// versionRun counts consecutive rows of one version, so the write path
// touches the map once per run (a batch is usually one version), not once
// per row.
type versionRun struct {
	version, n int64
}

// next adds a row of version; when it starts a new run, the finished one
// is handed to flush.
func (r *versionRun) next(version int64, flush func(version, n int64)) {
	if r.n > 0 && r.version != version {
		flush(r.version, r.n)
		r.n = 0
	}
	r.version = version
	r.n++
}

func (r *versionRun) done(flush func(version, n int64)) {
	if r.n > 0 {
		flush(r.version, r.n)
	}
}

// PolicyVersions describes the policy versions of a buffer's live rows.
type PolicyVersions struct {
	// Newest is the largest version ever written to the buffer (-1 before
	// the first row; after a restart, the largest among the rows that
	// survived).
	Newest int64 `json:"newest"`
	// Min and Max bound the versions of the live rows (-1 with none).
	Min int64 `json:"min"`
	Max int64 `json:"max"`
	// Rows counts live rows by version, newest first, for at most
	// maxVersionsShown versions; Older sums the rows of the versions left
	// out.
	Rows  []VersionRows `json:"rows"`
	Older int64         `json:"older_rows"`
}

// VersionRows is the number of live rows of one policy version.
type VersionRows struct {
	Version int64 `json:"version"`
	Rows    int64 `json:"rows"`
}

// maxVersionsShown bounds PolicyVersions.Rows, so an Info answer stays
// small whatever versions writers use.
const maxVersionsShown = 32

func (v *versionCounts) describe() PolicyVersions {
	out := PolicyVersions{Newest: v.newest, Min: -1, Max: -1, Rows: []VersionRows{}}
	versions := make([]int64, 0, len(v.rows))
	for ver := range v.rows {
		versions = append(versions, ver)
	}
	slices.Sort(versions)
	if len(versions) > 0 {
		out.Min, out.Max = versions[0], versions[len(versions)-1]
	}
	for i := len(versions) - 1; i >= 0; i-- {
		if len(out.Rows) < maxVersionsShown {
			out.Rows = append(out.Rows, VersionRows{versions[i], v.rows[versions[i]]})
		} else {
			out.Older += v.rows[versions[i]]
		}
	}
	return out
}

// countVersions rebuilds the version counts from the live rows' records,
// once the index is whole after recovery.
func (b *Buffer) countVersions() {
	b.ix.versions.init()
	for _, t := range b.ix.list {
		for i := range t.Len() {
			seq := t.Seq(i)
			var r record
			b.loadRecord(seq, &r)
			b.ix.versions.add(r.PolicyVersion, 1)
		}
	}
}

// PolicyVersions returns the policy versions of the live rows.
func (b *Buffer) PolicyVersions() (PolicyVersions, error) {
	var out PolicyVersions
	err := b.ReadIndex(func(Index) { out = b.ix.versions.describe() })
	return out, err
}

// NewestPolicyVersion returns the largest policy version written to the
// buffer (-1 before any row): what the age of a sampled row is measured
// against.
func (v Index) NewestPolicyVersion() int64 { return v.ix.versions.newest }

// CountAtLeastVersion returns how many live rows have a policy version of
// at least min.
func (v Index) CountAtLeastVersion(min int64) int64 {
	var n int64
	for ver, rows := range v.ix.versions.rows {
		if ver >= min {
			n += rows
		}
	}
	return n
}
