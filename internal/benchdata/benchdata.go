// Package benchdata holds what the HTTP benchmarks (server tests and
// bench/httpbench) share: the synthetic extend batches they write —
// deterministic rows of interleaved envs with cheap observation patterns,
// so both measure the same bytes — and the client side of a request.
package benchdata

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"

	"github.com/rbdb/rbd/codec"
	"github.com/rbdb/rbd/storage"
)

// Batch is batch k of one stream: n rows of envs interleaved envs (rows of
// one env are consecutive steps), done every episode steps, with the final
// observation of each done row (compact_obs). obsDType and obsShape shape
// the observation.
func Batch(obsDType string, obsShape []int, n, k, envs, episode int) []codec.Tensor {
	elems := 1
	for _, d := range obsShape {
		elems *= d
	}
	size := codec.DTypeSize(obsDType)
	obs := make([]byte, n*elems*size)
	action, reward, env := make([]byte, 8*n), make([]byte, 4*n), make([]byte, 8*n)
	done := make([]byte, n)
	var final []byte
	for r := 0; r < n; r++ {
		e, step := r%envs, k*(n/envs)+r/envs
		FillObs(obsDType, obs[r*elems*size:(r+1)*elems*size], int64(step*envs+e))
		binary.LittleEndian.PutUint64(action[8*r:], uint64(step%2))
		binary.LittleEndian.PutUint32(reward[4*r:], math.Float32bits(1))
		binary.LittleEndian.PutUint64(env[8*r:], uint64(e))
		if step%episode == episode-1 {
			done[r] = 1
			f := make([]byte, elems*size)
			FillObs(obsDType, f, -int64(step*envs+e))
			final = append(final, f...)
		}
	}
	ts := []codec.Tensor{
		{Name: "observation", DType: obsDType, Shape: append([]int{n}, obsShape...), Data: obs},
		{Name: "action", DType: "int64", Shape: []int{n}, Data: action},
		{Name: "next.reward", DType: "float32", Shape: []int{n}, Data: reward},
		{Name: "next.done", DType: "bool", Shape: []int{n}, Data: done},
		{Name: "next.terminated", DType: "bool", Shape: []int{n}, Data: done},
		{Name: "next.truncated", DType: "bool", Shape: []int{n}, Data: make([]byte, n)},
		{Name: "env", DType: "int64", Shape: []int{n}, Data: env},
	}
	if len(final) > 0 {
		ts = append(ts, codec.Tensor{Name: "next.observation", DType: obsDType,
			Shape: append([]int{len(final) / (elems * size)}, obsShape...), Data: final})
	}
	return ts
}

// FillObs writes a cheap pattern derived from v: float32 values v + i/16,
// or a linear congruential byte stream for other dtypes.
func FillObs(dtype string, dst []byte, v int64) {
	if dtype == "float32" {
		for i := 0; i+4 <= len(dst); i += 4 {
			binary.LittleEndian.PutUint32(dst[i:], math.Float32bits(float32(v)+float32(i)/16))
		}
		return
	}
	x := uint64(v)*0x9E3779B97F4A7C15 + 1
	for i := 0; i+8 <= len(dst); i += 8 {
		binary.LittleEndian.PutUint64(dst[i:], x)
		x = x*6364136223846793005 + 1442695040888963407
	}
}

// StorageBatch turns extend tensors of n rows into an in-process batch, for
// filling buffers fast without HTTP.
func StorageBatch(ts []codec.Tensor, n int) *storage.Batch {
	b := &storage.Batch{Rows: n, Fields: map[string][]byte{}}
	for _, t := range ts {
		if t.Name == "env" {
			b.Env = make([]int64, n)
			for i := range b.Env {
				b.Env[i] = int64(binary.LittleEndian.Uint64(t.Data[8*i:]))
			}
			continue
		}
		b.Fields[t.Name] = t.Data
	}
	return b
}

// Client keeps exactly conns keep-alive connections.
func Client(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		MaxIdleConns: conns, MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns,
		DisableCompression: true,
	}}
}

// Post sends one POST and reads the answer into *buf (grown as needed),
// returning its size. Any status but 200, or bytes past Content-Length,
// is an error.
func Post(hc *http.Client, url, ctype string, body []byte, buf *[]byte) (int, error) {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", ctype)
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return 0, fmt.Errorf("%s: %d %s", url, resp.StatusCode, msg)
	}
	n := int(resp.ContentLength)
	if n < 0 {
		return 0, errors.New("answer without Content-Length")
	}
	if cap(*buf) < n {
		*buf = make([]byte, n)
	}
	if _, err := io.ReadFull(resp.Body, (*buf)[:n]); err != nil {
		return 0, err
	}
	if m, _ := io.Copy(io.Discard, resp.Body); m != 0 {
		return 0, fmt.Errorf("%d bytes past Content-Length", m)
	}
	return n, nil
}
