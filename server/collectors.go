package server

import (
	"fmt"
	"net/http"

	"github.com/rbdb/rbd/codec"
)

// CollectorReporter is implemented by an Options.Weights that can also
// report its collectors' live state; it serves GET /v1/collectors/{name}.
type CollectorReporter interface {
	// CollectorInfo returns an error wrapping storage.ErrNotFound for an
	// unknown collector.
	CollectorInfo(collector string) (CollectorInfo, error)
}

// CollectorInfo is a collector's live state (GET /v1/collectors/{name}).
type CollectorInfo struct {
	Name string `json:"name"`
	// Env names the environment and Envs how many copies step together;
	// Buffer is where the rows go.
	Env    string `json:"env"`
	Envs   int    `json:"envs"`
	Buffer string `json:"buffer"`
	// Policy is the kind of policy acting now ("linear", "mlp" or "gru" for the
	// demo), Hidden its hidden width (0 without one) and Epsilon its
	// probability of a random action.
	Policy  string  `json:"policy"`
	Hidden  int     `json:"hidden,omitempty"`
	Epsilon float64 `json:"epsilon"`
	// WeightsVersion counts weight updates: 0 until the first.
	WeightsVersion int64 `json:"weights_version"`
	// Frames counts rows written and Episodes episodes ended;
	// MeanEpisodeReturn and MeanEpisodeLength are over the last 100
	// episodes (0 before the first).
	Frames            int64   `json:"frames"`
	Episodes          int64   `json:"episodes"`
	MeanEpisodeReturn float64 `json:"mean_episode_return"`
	MeanEpisodeLength float64 `json:"mean_episode_length"`
	FramesPerSecond   float64 `json:"frames_per_second"`
	// RateLimited tells whether the buffer's rate limiter holds the
	// collector's writes back now; RateLimitWaitSeconds sums the time it
	// did.
	RateLimited          bool    `json:"rate_limited"`
	RateLimitWaitSeconds float64 `json:"rate_limit_wait_seconds"`
}

func (s *Server) noCollector(name string) error {
	return &apiError{status: http.StatusNotFound, msg: fmt.Sprintf("no collector %q runs in this server (start it with --demo)", name)}
}

func (s *Server) getCollector(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	rep, ok := s.opts.Weights.(CollectorReporter)
	if !ok {
		return s.noCollector(name)
	}
	info, err := rep.CollectorInfo(name)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, info)
	return nil
}

func (s *Server) setWeights(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	if s.opts.Weights == nil {
		return s.noCollector(name)
	}
	body, err := readBody(w, r)
	if err != nil {
		return err
	}
	if err := leaseOf(w).grow(r.Context(), int64(len(body)), "decoding the weights"); err != nil {
		return err
	}
	tensors, _, err := codec.DecodeSafetensors(body)
	if err != nil {
		return err
	}
	vals, shapes, err := codec.Float32Map(tensors)
	if err != nil {
		return badRequest(err.Error())
	}
	if err := s.opts.Weights.SetWeights(name, vals, shapes); err != nil {
		return err
	}
	ans := map[string]any{"collector": name, "updated": true}
	if rep, ok := s.opts.Weights.(CollectorReporter); ok {
		if info, err := rep.CollectorInfo(name); err == nil {
			ans["weights_version"] = info.WeightsVersion
		}
	}
	writeJSON(w, http.StatusOK, ans)
	return nil
}
