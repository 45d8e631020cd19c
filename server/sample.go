package server

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"sort"
	"strconv"

	"github.com/rbdb/rbd"
	"github.com/rbdb/rbd/codec"
	"github.com/rbdb/rbd/storage"
)

func (s *Server) sample(w http.ResponseWriter, r *http.Request) error {
	b, err := s.buffer(r)
	if err != nil {
		return err
	}
	transport, err := streamParam(r)
	if err != nil {
		return err
	}
	if transport != transportSingle {
		body, err := s.readJSONBody(w, r)
		if err != nil {
			return err
		}
		return s.sampleStream(w, r, b, body, transport)
	}
	var req rbd.SampleRequest
	if err := s.readSampleRequest(w, r, &req); err != nil {
		return err
	}
	if req.TimeoutMS > 0 {
		done, err := s.mayWait()
		if err != nil {
			return err
		}
		defer done()
	}
	ctx := r.Context()
	l := leaseOf(w)
	batch, err := b.Sample(ctx, &req, &rbd.SampleOptions{MaxResponseBytes: s.opts.MaxResponse, MaxTimeout: s.opts.MaxWait,
		Reserve: func(n int64) error { return l.grow(ctx, n, "the sample answer") }, Stop: s.stopping})
	if err != nil {
		if ctx.Err() != nil {
			return clientGone(ctx.Err())
		}
		return err
	}
	defer batch.Release() // the answer is written by then: its memory serves the next sample
	// The answer's tensor list lives on the stack.
	var small [16]codec.Tensor
	tensors := s.answerTensors(b, batch, small[:0])
	return s.writeTensors(w, r, tensors, batch.Metadata)
}

// readSampleRequest reads and parses a single sample request's body. The
// body is read into pooled memory: it is garbage once parsed.
func (s *Server) readSampleRequest(w http.ResponseWriter, r *http.Request, req *rbd.SampleRequest) error {
	if err := isJSONBody(r); err != nil {
		return err
	}
	bp := s.sampleBodies.get()
	body, err := readBodyInto(w, r, *bp)
	if err != nil {
		return err
	}
	err = s.requests.parse(body, req)
	s.sampleBodies.put(bp, body)
	return err
}

// answerTensors counts a drawn batch in the metrics and appends its
// tensors to dst as the answer encodes them (aliasing the batch's memory).
func (s *Server) answerTensors(b *rbd.Buffer, batch *rbd.Batch, dst []codec.Tensor) []codec.Tensor {
	s.countSampled(b, batch)
	return appendBatchTensors(dst, batch)
}

// countSampled counts a batch's real rows (not padding) and its policy age.
func (s *Server) countSampled(b *rbd.Buffer, batch *rbd.Batch) {
	rows := 0
	if t, ok := batch.Tensor("seq"); ok {
		for i := 0; i < len(t.Data); i += 8 {
			if int64(binary.LittleEndian.Uint64(t.Data[i:])) >= 0 {
				rows++
			}
		}
	}
	s.metrics.sampled.WithLabelValues(b.Name()).Add(float64(rows))
	if rows > 0 {
		s.metrics.age.WithLabelValues(b.Name()).Observe(batch.PolicyAgeMean)
	}
}

// batchTensors returns a batch's tensors as the answer encodes them
// (aliasing the batch's memory).
func batchTensors(batch *rbd.Batch) []codec.Tensor {
	return appendBatchTensors(make([]codec.Tensor, 0, len(batch.Tensors)), batch)
}

// appendBatchTensors is batchTensors appending to dst (a stream reuses
// one list for all its batches).
func appendBatchTensors(dst []codec.Tensor, batch *rbd.Batch) []codec.Tensor {
	for _, t := range batch.Tensors {
		dst = append(dst, codec.Tensor{Name: t.Name, DType: t.DType.String(), Shape: t.Shape, Data: t.Data})
	}
	return dst
}

// mayWait counts a request that may wait (for data or for the rate
// limiter): it holds a goroutine and a connection for up to --max-wait, so
// their number is bounded too. done uncounts it.
func (s *Server) mayWait() (done func(), err error) {
	if n := s.waiting.Add(1); n > int64(s.opts.MaxWaiting) {
		s.waiting.Add(-1)
		s.budget.refused.Add(1)
		return nil, &apiError{status: http.StatusServiceUnavailable, code: "busy",
			msg: fmt.Sprintf("%d requests are already waiting (for data or the rate limiter) or streaming, the most allowed (--max-waiting): retry later, or send timeout_ms 0", s.opts.MaxWaiting)}
	}
	return func() { s.waiting.Add(-1) }, nil
}

// writeTensors answers with safetensors (the default) or, when the client
// accepts application/json, a JSON object of nested arrays. The batch was
// gathered once into its own memory, so writers overwriting the rows
// meanwhile cannot tear what is sent.
func (s *Server) writeTensors(w http.ResponseWriter, r *http.Request, tensors []codec.Tensor, meta map[string]string) error {
	if wantsJSON(r) {
		return s.writeJSONTensors(w, tensors, jsonMetadata(meta))
	}
	hp := s.answerHeaders.get()
	hdr, total, err := codec.AppendSafetensorsHeader(*hp, tensors, meta)
	defer s.answerHeaders.put(hp, hdr)
	if err != nil {
		return err
	}
	// Assigned, not Set: the values are shared and never changed, and Set
	// would allocate a slice for each.
	h := w.Header()
	h["Content-Type"] = octetStream
	h["Content-Length"] = s.contentLength(total)
	return ignoreWriteErr(s.writeEncoded(w, nil, hdr, tensors, total))
}

// octetStream is the Content-Type of binary answers, as a header value.
var octetStream = []string{"application/octet-stream"}

// lengthValue is a Content-Length header value and the length it says.
type lengthValue struct {
	n int64
	v []string
}

// contentLength returns the Content-Length header value for n bytes, from
// s.contentLengths when it holds it (the values are shared and never
// changed).
func (s *Server) contentLength(n int64) []string {
	slot := &s.contentLengths[n&15]
	if lv := slot.Load(); lv != nil && lv.n == n {
		return lv.v
	}
	lv := &lengthValue{n: n, v: []string{strconv.FormatInt(n, 10)}}
	slot.Store(lv)
	return lv.v
}

// maxPooledHeader bounds the safetensors header buffers kept for reuse.
const maxPooledHeader = 16 << 10

// writeEncoded writes prefix (a stream frame's length word, or nothing),
// a safetensors header and the tensors' bytes, total bytes after prefix.
// Up to maxAssembledAnswer they are copied into one pooled buffer and
// written with one Write: net/http sends each Write through buffers of 2
// and 4 KiB, so a small answer written tensor by tensor took 6-8 system
// calls where one Write of the whole takes 2. Larger ones are written
// part by part, where the copy would cost more than the calls it saves.
func (s *Server) writeEncoded(w http.ResponseWriter, prefix, hdr []byte, tensors []codec.Tensor, total int64) error {
	if int64(len(prefix))+total > maxAssembledAnswer {
		for _, part := range [][]byte{prefix, hdr} {
			if _, err := w.Write(part); err != nil {
				return err
			}
		}
		for _, t := range tensors {
			if _, err := w.Write(t.Data); err != nil {
				return err
			}
		}
		return nil
	}
	bp, _ := s.answers.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	buf := append(append((*bp)[:0], prefix...), hdr...)
	for _, t := range tensors {
		buf = append(buf, t.Data...)
	}
	_, err := w.Write(buf)
	*bp = buf[:0]
	s.answers.Put(bp)
	return err
}

// maxAssembledAnswer bounds the binary answers copied into one buffer
// before they are written (writeEncoded).
const maxAssembledAnswer = 256 << 10

// jsonAnswerBuf is the buffer a JSON answer is written through.
const jsonAnswerBuf = 64 << 10

// jsonMetadata is a batch's metadata as a JSON answer carries it: numbers
// and booleans as such, anything else as a string.
func jsonMetadata(meta map[string]string) map[string]any {
	extra := make(map[string]any, len(meta))
	for k, v := range meta {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			extra[k] = n
		} else if f, err := strconv.ParseFloat(v, 64); err == nil && !math.IsInf(f, 0) && !math.IsNaN(f) {
			extra[k] = f
		} else if bv, err := strconv.ParseBool(v); err == nil {
			extra[k] = bv
		} else {
			extra[k] = v
		}
	}
	return extra
}

// writeJSONTensors answers a JSON object of nested arrays. Its exact size
// is computed first (without making the text), so an answer over
// --max-response is refused before anything is sent, and the text is then
// streamed through a small buffer: JSON is several times the binary size,
// and it never exists whole in memory.
func (s *Server) writeJSONTensors(w http.ResponseWriter, tensors []codec.Tensor, extra map[string]any) error {
	// The small parts: each key, and each extra value's JSON.
	keys := make([][]byte, len(tensors))
	size := int64(2) // the braces
	for i, t := range tensors {
		keys[i] = append(strconv.AppendQuote(nil, t.Name), ':')
		n, err := codec.JSONTensorSize(&t)
		if err != nil {
			return err
		}
		size += int64(len(keys[i])) + n
	}
	var extras [][]byte
	for k, v := range extra {
		js, err := json.Marshal(v)
		if err != nil {
			return err
		}
		extras = append(extras, append(append(strconv.AppendQuote(nil, k), ':'), js...))
		size += int64(len(extras[len(extras)-1]))
	}
	if parts := len(tensors) + len(extras); parts > 1 {
		size += int64(parts - 1) // commas
	}
	size++ // the newline after "}"
	if size > s.opts.MaxResponse {
		return &apiError{status: http.StatusBadRequest, code: "response_too_large",
			msg: fmt.Sprintf("the JSON answer would be %d bytes, more than --max-response %d: ask for safetensors (Accept: application/octet-stream) or fewer rows", size, s.opts.MaxResponse)}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	bw := bufio.NewWriterSize(w, int(min(size, jsonAnswerBuf)))
	bw.WriteByte('{')
	for i := range tensors {
		if i > 0 {
			bw.WriteByte(',')
		}
		bw.Write(keys[i])
		if err := codec.WriteJSONTensor(bw, &tensors[i]); err != nil {
			return ignoreWriteErr(err)
		}
	}
	for i, e := range extras {
		if i > 0 || len(tensors) > 0 {
			bw.WriteByte(',')
		}
		bw.Write(e)
	}
	bw.WriteString("}\n")
	return ignoreWriteErr(bw.Flush())
}

// ignoreWriteErr drops errors from writing an answer: the status is sent,
// the client went away, nothing can be told to it.
func ignoreWriteErr(error) error { return nil }

// Limits of one rows answer.
const (
	maxRowsPerAnswer  = 65536
	maxRowsAnswerByte = 64 << 20
)

func (s *Server) rows(w http.ResponseWriter, r *http.Request) error {
	b, err := s.buffer(r)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	from, err := intParam(q.Get("from_seq"), 0, "from_seq")
	if err != nil {
		return err
	}
	count, err := intParam(q.Get("count"), 100, "count")
	if err != nil {
		return err
	}
	if count < 1 {
		return badRequest("count: must be at least 1")
	}
	spec := b.Spec()
	rowBytes := 0
	var cols []storage.Column
	for _, f := range spec.Fields {
		c, _ := b.Column(f.Name)
		cols = append(cols, c)
		rowBytes += c.RowBytes
	}
	limit := min(count, maxRowsPerAnswer, int64(max(1, maxRowsAnswerByte/max(rowBytes, 1))))
	// The rows are gathered, then copied into the answer: twice their
	// bytes, plus 5 metadata columns of 8 bytes per row.
	if err := leaseOf(w).grow(r.Context(), limit*(2*int64(rowBytes)+48), "the rows answer"); err != nil {
		return err
	}
	var seqs []int64
	if tv := q.Get("traj_id"); tv != "" {
		id, err := intParam(tv, 0, "traj_id")
		if err != nil {
			return err
		}
		if from < 0 {
			return badRequest(fmt.Sprintf("from_seq: %d is negative; with traj_id it pages within the trajectory (rows from that seq on)", from))
		}
		if seqs, err = trajectorySeqs(b, id, from, int(limit)); err != nil {
			return err
		}
	} else {
		seqs = b.LiveSeqs(from, int(limit))
	}
	dst := make([][]byte, len(cols))
	for i, c := range cols {
		dst[i] = make([]byte, len(seqs)*c.RowBytes)
	}
	meta := make([]storage.RowMeta, len(seqs))
	missing, err := b.Gather(seqs, cols, dst, meta)
	if err != nil {
		return err
	}
	keep := make([]bool, len(seqs))
	for i := range keep {
		keep[i] = true
	}
	for _, i := range missing {
		keep[i] = false // overwritten between listing and copying
	}
	n := len(seqs) - len(missing)
	var tensors []codec.Tensor
	for i, c := range cols {
		data := make([]byte, 0, n*c.RowBytes)
		for j := range seqs {
			if keep[j] {
				data = append(data, dst[i][j*c.RowBytes:(j+1)*c.RowBytes]...)
			}
		}
		tensors = append(tensors, codec.Tensor{Name: c.Name, DType: c.DType.String(), Shape: append([]int{n}, c.Shape...), Data: data})
	}
	for _, m := range []struct {
		name string
		get  func(storage.RowMeta) int64
	}{
		{"seq", func(m storage.RowMeta) int64 { return m.Seq }},
		{"traj_id", func(m storage.RowMeta) int64 { return m.TrajID }},
		{"step", func(m storage.RowMeta) int64 { return m.Step }},
		{"prev_seq", func(m storage.RowMeta) int64 { return m.PrevSeq }},
		{"next_seq", func(m storage.RowMeta) int64 { return m.NextSeq }},
	} {
		data := make([]byte, 0, 8*n)
		for j := range seqs {
			if keep[j] {
				data = binary.LittleEndian.AppendUint64(data, uint64(m.get(meta[j])))
			}
		}
		tensors = append(tensors, codec.Tensor{Name: m.name, DType: "int64", Shape: []int{n}, Data: data})
	}
	return s.writeTensors(w, r, tensors, nil)
}

// trajectorySeqs returns the seqs of trajectory id's live rows from seq
// from on, oldest first, at most limit (none for a trajectory with no live
// rows).
func trajectorySeqs(b *rbd.Buffer, id, from int64, limit int) ([]int64, error) {
	var seqs []int64
	err := b.ReadIndex(func(v storage.Index) {
		t := v.ByID(id)
		if t == nil {
			return
		}
		// A trajectory's seqs grow with its steps: start at the first
		// seq >= from.
		n := t.Len()
		for i := sort.Search(n, func(i int) bool { return t.Seq(i) >= from }); i < n && len(seqs) < limit; i++ {
			seqs = append(seqs, t.Seq(i))
		}
	})
	return seqs, err
}

func intParam(v string, def int64, name string) (int64, error) {
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, badRequest(fmt.Sprintf("%s: %q is not an integer", name, v))
	}
	return n, nil
}
