package server

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/rbdb/rbd/storage"
)

// The aggregate endpoints behind the dashboard (docs/dashboard.md). Each
// answer costs bounded work whatever the buffer's size, so a page polling
// every second next to a full-speed writer costs the server little.

// CollectorHistory is implemented by an Options.Weights whose collectors
// keep a recent history; it serves GET /v1/collectors and the collectors'
// part of GET /v1/activity.
type CollectorHistory interface {
	CollectorReporter
	// Collectors names the collectors the server runs.
	Collectors() []string
	// CollectorActivity returns the collector's points after since (unix
	// seconds), or an error wrapping storage.ErrNotFound.
	CollectorActivity(name string, since int64) (CollectorActivity, error)
}

// CollectorActivity is a collector's recent history, one point per second
// in which it wrote a batch, oldest first: the frames and episodes so far
// and the mean return and length of its last 100 episodes then.
type CollectorActivity struct {
	T                 []int64   `json:"t"`
	Frames            []float64 `json:"frames"`
	Episodes          []float64 `json:"episodes"`
	MeanEpisodeReturn []float64 `json:"mean_episode_return"`
	MeanEpisodeLength []float64 `json:"mean_episode_length"`
}

// activityAnswer is GET /v1/activity.
type activityAnswer struct {
	// Now is the server's clock (unix seconds): the since of the next poll.
	Now           int64                        `json:"now"`
	WindowSeconds int                          `json:"window_seconds"`
	Buffers       map[string]storage.Activity  `json:"buffers"`
	Collectors    map[string]CollectorActivity `json:"collectors"`
}

// activity answers every buffer's and collector's points after ?since=
// (unix seconds; omitted or 0: the whole window). A poller passes the last
// answer's now and gets only what is new.
func (s *Server) activity(w http.ResponseWriter, r *http.Request) error {
	since, err := intParam(r.URL.Query().Get("since"), 0, "since")
	if err != nil {
		return err
	}
	if since < 0 {
		return badRequest(fmt.Sprintf("since: %d is negative (unix seconds, or 0 for the whole window)", since))
	}
	ans := activityAnswer{Now: time.Now().Unix(), WindowSeconds: storage.ActivityWindow,
		Buffers: map[string]storage.Activity{}, Collectors: map[string]CollectorActivity{}}
	for _, b := range s.db.Buffers() {
		ans.Buffers[b.Name()] = b.Activity(since)
	}
	if h, ok := s.opts.Weights.(CollectorHistory); ok {
		for _, name := range h.Collectors() {
			if a, err := h.CollectorActivity(name, since); err == nil {
				ans.Collectors[name] = a
			}
		}
	}
	writeJSON(w, http.StatusOK, ans)
	return nil
}

// listCollectors is GET /v1/collectors.
func (s *Server) listCollectors(w http.ResponseWriter, _ *http.Request) error {
	out := []CollectorInfo{}
	if h, ok := s.opts.Weights.(CollectorHistory); ok {
		for _, name := range h.Collectors() {
			if info, err := h.CollectorInfo(name); err == nil {
				out = append(out, info)
			}
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"collectors": out})
	return nil
}

// Bounds of a stats answer.
const (
	defaultStatsBuckets = 30
	maxStatsBuckets     = 200
	// prioritySampleRows is how many live rows the priority histogram is
	// drawn from: enough for a smooth histogram, and the same cost at any
	// buffer size.
	prioritySampleRows = 2048
	// maxStatsStreams bounds the streams listed by name; the rest are
	// summed up.
	maxStatsStreams = 100
	// recentErrors is how many failed requests each buffer remembers.
	recentErrors = 20
)

// statsAnswer is GET /v1/buffers/{name}/stats.
type statsAnswer struct {
	Name              string                  `json:"name"`
	TrajectoryLengths storage.LengthHistogram `json:"trajectory_lengths"`
	// Priorities is nil for buffers without priorities.
	Priorities *priorityHistogram `json:"priorities"`
	// OpenByStream lists the streams with the most open trajectories;
	// OtherStreams sums up the open trajectories of the streams left out.
	OpenByStream []streamOpen  `json:"open_trajectories_by_stream"`
	OtherStreams *otherStreams `json:"other_streams,omitempty"`
	Errors       errorSummary  `json:"errors"`
}

type streamOpen struct {
	Stream string `json:"stream"`
	Open   int    `json:"open_trajectories"`
}

type otherStreams struct {
	Streams int `json:"streams"`
	Open    int `json:"open_trajectories"`
}

// priorityHistogram is drawn from a uniform sample of live rows.
type priorityHistogram struct {
	Sampled int       `json:"sampled"`
	Min     float64   `json:"min"`
	Max     float64   `json:"max"`
	Mean    float64   `json:"mean"`
	Scale   string    `json:"scale"` // "linear" or "log": how the edges are spaced
	Edges   []float64 `json:"edges"`
	Counts  []int     `json:"counts"`
}

func (s *Server) bufferStats(w http.ResponseWriter, r *http.Request) error {
	b, err := s.buffer(r)
	if err != nil {
		return err
	}
	buckets, err := intParam(r.URL.Query().Get("buckets"), defaultStatsBuckets, "buckets")
	if err != nil {
		return err
	}
	if buckets < 1 || buckets > maxStatsBuckets {
		return badRequest(fmt.Sprintf("buckets: %d is outside 1..%d", buckets, maxStatsBuckets))
	}
	ans := statsAnswer{Name: b.Name(), OpenByStream: []streamOpen{}}
	if err := b.ReadIndex(func(v storage.Index) { ans.TrajectoryLengths = v.TrajectoryLengths(int(buckets)) }); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0x5eed))
	prios, err := b.SamplePriorities(prioritySampleRows, rng)
	if err != nil {
		return err
	}
	if prios != nil {
		ans.Priorities = histogramOf(prios, int(buckets))
	}
	for st, n := range b.OpenTrajectoriesByStream() {
		ans.OpenByStream = append(ans.OpenByStream, streamOpen{Stream: st, Open: n})
	}
	slices.SortFunc(ans.OpenByStream, func(a, b streamOpen) int {
		return cmp.Or(cmp.Compare(b.Open, a.Open), cmp.Compare(a.Stream, b.Stream))
	})
	if len(ans.OpenByStream) > maxStatsStreams {
		rest := &otherStreams{Streams: len(ans.OpenByStream) - maxStatsStreams}
		for _, so := range ans.OpenByStream[maxStatsStreams:] {
			rest.Open += so.Open
		}
		ans.OpenByStream, ans.OtherStreams = ans.OpenByStream[:maxStatsStreams], rest
	}
	ans.Errors = s.errs.summary(b.Name())
	writeJSON(w, http.StatusOK, ans)
	return nil
}

// histogramOf buckets sorted values: log-spaced edges when they are all
// positive and span two orders of magnitude or more (priorities usually
// do), equal widths otherwise.
func histogramOf(sorted []float64, buckets int) *priorityHistogram {
	h := &priorityHistogram{Sampled: len(sorted), Scale: "linear", Edges: []float64{}, Counts: []int{}}
	if len(sorted) == 0 {
		return h
	}
	lo, hi := sorted[0], sorted[len(sorted)-1]
	sum := 0.0
	for _, v := range sorted {
		sum += v
	}
	h.Min, h.Max, h.Mean = lo, hi, sum/float64(len(sorted))
	if hi == lo {
		h.Edges, h.Counts = []float64{lo, hi}, []int{len(sorted)}
		return h
	}
	edge := func(i int) float64 { return lo + (hi-lo)*float64(i)/float64(buckets) }
	if lo > 0 && hi/lo >= 100 {
		h.Scale = "log"
		edge = func(i int) float64 { return lo * math.Pow(hi/lo, float64(i)/float64(buckets)) }
	}
	h.Edges = make([]float64, buckets+1)
	for i := range h.Edges {
		h.Edges[i] = edge(i)
	}
	h.Edges[buckets] = hi // exact, whatever the rounding
	h.Counts = make([]int, buckets)
	j := 0
	for i := range buckets {
		// Bucket i holds [edge i, edge i+1); the last one includes hi.
		end := len(sorted)
		if i < buckets-1 {
			end = j + countBelow(sorted[j:], h.Edges[i+1])
		}
		h.Counts[i] = end - j
		j = end
	}
	return h
}

// countBelow returns how many of the sorted values are below x.
func countBelow(sorted []float64, x float64) int {
	i, _ := slices.BinarySearch(sorted, x)
	return i
}

// errorLog remembers, per buffer, the failed requests that named it: counts
// by status and code, and the last few with their messages. Only existing
// buffers get an entry (a request naming an unknown buffer cannot grow it),
// and deleting a buffer drops its entry.
type errorLog struct {
	mu   sync.Mutex
	bufs map[string]*bufferErrors
}

type bufferErrors struct {
	byStatus map[int]int64
	byCode   map[string]int64
	recent   []failedRequest // oldest first, at most recentErrors
}

// failedRequest is one remembered failure. Error is the message the client
// got: it may quote the request, so the page shows it as text only.
type failedRequest struct {
	Time     time.Time `json:"time"`
	Endpoint string    `json:"endpoint"`
	Status   int       `json:"status"`
	Code     string    `json:"code,omitempty"`
	Error    string    `json:"error"`
}

type errorSummary struct {
	ByStatus map[string]int64 `json:"by_status"`
	ByCode   map[string]int64 `json:"by_code"`
	Recent   []failedRequest  `json:"recent"`
}

func (l *errorLog) note(buffer string, f failedRequest) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bufs == nil {
		l.bufs = map[string]*bufferErrors{}
	}
	e := l.bufs[buffer]
	if e == nil {
		e = &bufferErrors{byStatus: map[int]int64{}, byCode: map[string]int64{}}
		l.bufs[buffer] = e
	}
	e.byStatus[f.Status]++
	if f.Code != "" {
		e.byCode[f.Code]++
	}
	if len(e.recent) == recentErrors {
		copy(e.recent, e.recent[1:])
		e.recent = e.recent[:recentErrors-1]
	}
	e.recent = append(e.recent, f)
}

func (l *errorLog) forget(buffer string) {
	l.mu.Lock()
	delete(l.bufs, buffer)
	l.mu.Unlock()
}

func (l *errorLog) summary(buffer string) errorSummary {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := errorSummary{ByStatus: map[string]int64{}, ByCode: map[string]int64{}, Recent: []failedRequest{}}
	e := l.bufs[buffer]
	if e == nil {
		return out
	}
	for st, n := range e.byStatus {
		out.ByStatus[strconv.Itoa(st)] = n
	}
	for c, n := range e.byCode {
		out.ByCode[c] = n
	}
	out.Recent = append(out.Recent, e.recent...)
	return out
}
