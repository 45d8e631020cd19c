package server

import (
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rbdb/rbd"
	"github.com/rbdb/rbd/ratelimit"
)

type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	written  *prometheus.CounterVec
	updated  *prometheus.CounterVec
	sampled  *prometheus.CounterVec
	age      *prometheus.HistogramVec
}

func newMetrics(reg *prometheus.Registry, db *rbd.DB, bud *budget, streams, idleReleases *atomic.Int64) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rbd_http_requests_total", Help: "HTTP requests by endpoint and status code.",
		}, []string{"endpoint", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rbd_http_request_duration_seconds", Help: "HTTP request latency by endpoint.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2.5, 14),
		}, []string{"endpoint"}),
		written: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rbd_store_rows_written_total", Help: "Rows written through the API, by buffer.",
		}, []string{"buffer"}),
		updated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rbd_store_rows_updated_total",
			Help: "Seqs named by updates of mutable fields, by buffer and result (updated: applied; stale: no longer live).",
		}, []string{"buffer", "result"}),
		sampled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rbd_sampler_rows_sampled_total", Help: "Rows returned by sample requests, by buffer.",
		}, []string{"buffer"}),
		age: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "rbd_sample_policy_age",
			Help:    "Per sample answer, the mean of its rows' policy ages: the newest policy version written to the buffer minus the row's.",
			Buckets: []float64{0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024},
		}, []string{"buffer"}),
	}
	reg.MustRegister(m.requests, m.duration, m.written, m.updated, m.sampled, m.age, &bufferCollector{db: db},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "rbd_memory_budget_bytes", Help: "Memory requests may hold in flight together (--max-memory).",
		}, func() float64 { return float64(bud.total) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "rbd_memory_in_flight_bytes", Help: "Memory reserved by requests in flight (bodies, decoded rows, answers).",
		}, func() float64 { return float64(bud.used()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "rbd_memory_refused_total", Help: "Requests refused because the memory budget stayed in use (503 busy) or was too small for them (413).",
		}, func() float64 { return float64(bud.refused.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "rbd_memory_idle_releases_total", Help: "Times the server, quiet for 2 s after allocating, collected garbage and returned its freed heap to the OS.",
		}, func() float64 { return float64(idleReleases.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "rbd_store_memory_bytes", Help: "Memory the open buffers may hold once full (rows of memory buffers, per-row structures).",
		}, func() float64 { u, _ := db.Store().MemoryUse(); return float64(u) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "rbd_sample_streams", Help: "Sample streams open now (POST .../sample?stream=1).",
		}, func() float64 { return float64(streams.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "rbd_store_memory_limit_bytes", Help: "Memory left to buffers; a create past it is a 507.",
		}, func() float64 { _, l := db.Store().MemoryUse(); return float64(l) }))
	return m
}

func (m *metrics) observe(endpoint string, code int, d time.Duration) {
	m.requests.WithLabelValues(endpoint, statusLabel(code)).Inc()
	m.duration.WithLabelValues(endpoint).Observe(d.Seconds())
}

// statusLabel is strconv.Itoa(code) without an allocation for the codes
// the server answers most (every request is counted).
func statusLabel(code int) string {
	switch code {
	case http.StatusOK:
		return "200"
	case http.StatusNoContent:
		return "204"
	case http.StatusBadRequest:
		return "400"
	case http.StatusNotFound:
		return "404"
	case http.StatusServiceUnavailable:
		return "503"
	}
	return strconv.Itoa(code)
}

// bufferCollector reports each buffer's state at scrape time, so the
// gauges can never drift from the store.
type bufferCollector struct{ db *rbd.DB }

var (
	descLive     = prometheus.NewDesc("rbd_buffer_live_rows", "Live rows in the buffer.", []string{"buffer"}, nil)
	descWrites   = prometheus.NewDesc("rbd_buffer_write_count", "Rows ever written to the buffer (the next seq).", []string{"buffer"}, nil)
	descTraj     = prometheus.NewDesc("rbd_buffer_trajectories", "Live trajectories.", []string{"buffer"}, nil)
	descOpen     = prometheus.NewDesc("rbd_buffer_open_trajectories", "Trajectories a stream may still extend.", []string{"buffer"}, nil)
	descBytes    = prometheus.NewDesc("rbd_buffer_bytes", "Bytes per field: logical (plain layout) and stored.", []string{"buffer", "field", "kind"}, nil)
	descDurable  = prometheus.NewDesc("rbd_buffer_durable_seq", "Durable watermark: rows below it are on stable storage.", []string{"buffer"}, nil)
	descRatio    = prometheus.NewDesc("rbd_buffer_bytes_ratio", "Logical over stored bytes per field (absent while nothing is stored).", []string{"buffer", "field"}, nil)
	descDisk     = prometheus.NewDesc("rbd_buffer_disk_bytes", "Space the buffer's files take on disk (0 for memory buffers).", []string{"buffer"}, nil)
	descCache    = prometheus.NewDesc("rbd_buffer_chunk_cache_lookups_total", "Decoded-chunk cache lookups of compressed buffers, by result.", []string{"buffer", "result"}, nil)
	descPVNewest = prometheus.NewDesc("rbd_buffer_policy_version_newest", "The largest policy_version written to the buffer (absent before the first row).", []string{"buffer"}, nil)
	descPVLive   = prometheus.NewDesc("rbd_buffer_policy_version", "The smallest and largest policy_version of the live rows (bound min, max).", []string{"buffer", "bound"}, nil)
	descCacheB   = prometheus.NewDesc("rbd_buffer_chunk_cache_bytes", "Bytes held by the decoded-chunk cache of compressed buffers.", []string{"buffer"}, nil)

	// The rate limiter of buffers that have one.
	descRLDiff    = prometheus.NewDesc("rbd_rate_limit_diff", "samples_per_insert*inserts - samples since the limiter's counters restarted.", []string{"buffer"}, nil)
	descRLBound   = prometheus.NewDesc("rbd_rate_limit_diff_bound", "The window diff is kept in: min_diff and max_diff (absent without samples_per_insert).", []string{"buffer", "bound"}, nil)
	descRLWaiting = prometheus.NewDesc("rbd_rate_limit_waiting", "Requests waiting for the rate limiter, by side (samples, extends).", []string{"buffer", "side"}, nil)
	descRLWait    = prometheus.NewDesc("rbd_rate_limit_wait_seconds_total", "Seconds requests spent waiting for the rate limiter, by side.", []string{"buffer", "side"}, nil)
	descRLRefused = prometheus.NewDesc("rbd_rate_limit_refused_total", "Requests the rate limiter did not admit before their deadline (503 rate_limited), by side.", []string{"buffer", "side"}, nil)
	descRLBlocked = prometheus.NewDesc("rbd_rate_limit_blocked", "1 for the side the rate limiter holds back now (samples or extends), 0 for the other.", []string{"buffer", "side"}, nil)
)

func (c *bufferCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLive, descWrites, descTraj, descOpen, descBytes, descDurable, descRatio, descDisk, descCache, descCacheB,
		descRLDiff, descRLBound, descRLWaiting, descRLWait, descRLRefused, descRLBlocked, descPVNewest, descPVLive} {
		ch <- d
	}
}

func (c *bufferCollector) Collect(ch chan<- prometheus.Metric) {
	for _, b := range c.db.Buffers() {
		info, err := b.Info()
		if err != nil {
			continue // deleted meanwhile
		}
		g := func(d *prometheus.Desc, v float64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
		}
		g(descLive, float64(info.Size), info.Name)
		g(descWrites, float64(info.WriteCount), info.Name)
		g(descTraj, float64(info.Trajectories), info.Name)
		g(descOpen, float64(info.OpenTrajectories), info.Name)
		g(descDurable, float64(info.Durable), info.Name)
		g(descDisk, float64(info.DiskBytes), info.Name)
		if pv := info.PolicyVersions; pv.Newest >= 0 {
			g(descPVNewest, float64(pv.Newest), info.Name)
			if pv.Min >= 0 {
				g(descPVLive, float64(pv.Min), info.Name, "min")
				g(descPVLive, float64(pv.Max), info.Name, "max")
			}
		}
		for f, fb := range info.Bytes {
			g(descBytes, float64(fb.Logical), info.Name, f, "logical")
			g(descBytes, float64(fb.Stored), info.Name, f, "stored")
			if fb.Stored > 0 {
				g(descRatio, float64(fb.Logical)/float64(fb.Stored), info.Name, f)
			}
		}
		if cs := info.Cache; cs != nil {
			ch <- prometheus.MustNewConstMetric(descCache, prometheus.CounterValue, float64(cs.Hits), info.Name, "hit")
			ch <- prometheus.MustNewConstMetric(descCache, prometheus.CounterValue, float64(cs.Misses), info.Name, "miss")
			g(descCacheB, float64(cs.Bytes), info.Name)
		}
		if rl := info.RateLimit; rl != nil {
			collectRateLimit(ch, info.Name, rl)
		}
	}
}

func collectRateLimit(ch chan<- prometheus.Metric, name string, rl *ratelimit.State) {
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	c := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	g(descRLDiff, rl.Diff, name)
	if rl.MinDiff != nil {
		g(descRLBound, *rl.MinDiff, name, "min_diff")
		g(descRLBound, *rl.MaxDiff, name, "max_diff")
	}
	sides := []struct {
		side            string
		waiting         int
		waited, refused float64
	}{
		{"samples", rl.WaitingSamples, rl.SampleWaitSeconds, float64(rl.RefusedSamples)},
		{"extends", rl.WaitingExtends, rl.ExtendWaitSeconds, float64(rl.RefusedExtends)},
	}
	for _, s := range sides {
		g(descRLWaiting, float64(s.waiting), name, s.side)
		c(descRLWait, s.waited, name, s.side)
		c(descRLRefused, s.refused, name, s.side)
		blocked := 0.0
		if rl.Blocked == s.side {
			blocked = 1
		}
		g(descRLBlocked, blocked, name, s.side)
	}
}
