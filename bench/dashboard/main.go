// Command dashboard measures what an open dashboard costs a busy server:
//
//	go run ./bench/dashboard [-phase 15s] [-rates 0,20,50] [-rounds 3] [-rbd PATH] [-json]
//
// It runs the real binary, `rbd serve --demo --demo-rate 0` (the demo
// collector writing CartPole rows as fast as it can: full ingest), and in
// phases polls what the dashboard's buffer page fetches on each refresh
// (the buffer list, the buffer's info, its stats and the activity of the
// last seconds) at each rate of -rates, the rates interleaved over -rounds
// so that drift of the machine hits all of them alike. For each phase it
// reads the server's CPU time from /proc/PID/stat and its ingest from the
// write count.
//
// The page refreshes once a second. Its cost per refresh is measured at a
// higher rate, where it stands out of the noise, and divided down:
// (CPU at R polls/s - CPU at 0, scaled to the same ingest) / R. The figures
// go to docs/performance.md ("Dashboard").
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rbdb/rbd/internal/testbin"
)

type phase struct {
	Rate        float64 `json:"polls_per_second"`
	Polls       int     `json:"polls"`
	CPUPercent  float64 `json:"server_cpu_percent"`
	IngestRowsS float64 `json:"ingest_rows_per_second"`
}

func main() {
	phaseLen := flag.Duration("phase", 15*time.Second, "length of one measuring phase")
	ratesFlag := flag.String("rates", "0,20,50", "poll rates (refreshes per second) to measure; 0 is the baseline")
	rounds := flag.Int("rounds", 3, "rounds over the rates")
	bin := flag.String("rbd", "", "rbd binary (default: build ./cmd/rbd)")
	asJSON := flag.Bool("json", false, "print one JSON object per phase")
	flag.Parse()
	if err := run(*phaseLen, *ratesFlag, *rounds, *bin, *asJSON); err != nil {
		fmt.Fprintln(os.Stderr, "dashboard:", err)
		os.Exit(1)
	}
}

func run(phaseLen time.Duration, ratesFlag string, rounds int, bin string, asJSON bool) error {
	var rates []float64
	for _, f := range strings.Split(ratesFlag, ",") {
		r, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || r < 0 {
			return fmt.Errorf("-rates: %q is not a rate", f)
		}
		rates = append(rates, r)
	}
	tmp, err := os.MkdirTemp("", "rbd-dashboard-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if bin == "" {
		if bin, err = testbin.BuildRbd(tmp); err != nil {
			return err
		}
	}
	srv, err := testbin.StartServer(bin, filepath.Join(tmp, "data"), 30*time.Second, "--demo", "--demo-rate", "0", "--demo-seed", "1")
	if err != nil {
		return err
	}
	defer srv.Kill()
	hc := &http.Client{Timeout: 10 * time.Second}
	get := func(path string) ([]byte, error) {
		resp, err := hc.Get(srv.URL + path)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("GET %s: %d %s", path, resp.StatusCode, b)
		}
		return b, err
	}
	writeCount := func() (int64, error) {
		b, err := get("/v1/buffers/demo")
		if err != nil {
			return 0, err
		}
		var info struct {
			WriteCount int64 `json:"write_count"`
		}
		return info.WriteCount, json.Unmarshal(b, &info)
	}
	// One refresh of the buffer page, as app.js sends it.
	refresh := func() error {
		for _, p := range []string{"/v1/buffers", "/v1/buffers/demo", "/v1/buffers/demo/stats",
			fmt.Sprintf("/v1/activity?since=%d", time.Now().Unix()-2)} {
			if _, err := get(p); err != nil {
				return err
			}
		}
		return nil
	}
	pid := srv.Cmd.Process.Pid
	time.Sleep(3 * time.Second) // the collector reaches its pace
	var phases []phase
	for range rounds {
		for _, r := range rates {
			cpu0, err := cpuSeconds(pid)
			if err != nil {
				return err
			}
			wc0, err := writeCount()
			if err != nil {
				return err
			}
			start := time.Now()
			polls := 0
			for time.Since(start) < phaseLen {
				if r == 0 {
					time.Sleep(phaseLen - time.Since(start))
					break
				}
				next := start.Add(time.Duration(float64(polls+1) / r * float64(time.Second)))
				if err := refresh(); err != nil {
					return err
				}
				polls++
				time.Sleep(time.Until(next))
			}
			el := time.Since(start).Seconds()
			cpu1, err := cpuSeconds(pid)
			if err != nil {
				return err
			}
			wc1, err := writeCount()
			if err != nil {
				return err
			}
			p := phase{Rate: r, Polls: polls, CPUPercent: 100 * (cpu1 - cpu0) / el, IngestRowsS: float64(wc1-wc0) / el}
			phases = append(phases, p)
			if asJSON {
				b, _ := json.Marshal(p)
				fmt.Println(string(b))
			} else {
				fmt.Fprintf(os.Stderr, "rate %g: %d polls, server CPU %.1f%%, ingest %.0f rows/s\n", r, polls, p.CPUPercent, p.IngestRowsS)
			}
		}
	}
	if asJSON {
		return nil
	}
	// Per rate: the mean over rounds, and the cost of one refresh against
	// the baseline scaled to the same ingest.
	type agg struct {
		cpu, ingest float64
		n           int
	}
	by := map[float64]*agg{}
	for _, p := range phases {
		a := by[p.Rate]
		if a == nil {
			a = &agg{}
			by[p.Rate] = a
		}
		a.cpu += p.CPUPercent
		a.ingest += p.IngestRowsS
		a.n++
	}
	base := by[0]
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "refreshes/s\tserver CPU %%\tingest rows/s\tCPU ms per refresh\tcore %% at 1 refresh/s\t\n")
	for _, r := range rates {
		a := by[r]
		cpu, ingest := a.cpu/float64(a.n), a.ingest/float64(a.n)
		per, share := "-", "-"
		if r > 0 && base != nil {
			bc, bi := base.cpu/float64(base.n), base.ingest/float64(base.n)
			extra := cpu - bc*ingest/bi // percent of a core beyond what the ingest costs
			per = fmt.Sprintf("%.2f", extra/100/r*1000)
			share = fmt.Sprintf("%.3f", extra/r)
		}
		fmt.Fprintf(tw, "%g\t%.1f\t%.0f\t%s\t%s\t\n", r, cpu, ingest, per, share)
		delete(by, r)
	}
	return tw.Flush()
}

// cpuSeconds is the user + system CPU time of process pid so far.
func cpuSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces: fields start after the last ')'.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	ut, err1 := strconv.ParseFloat(f[11], 64)
	st, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	const clkTck = 100 // USER_HZ on Linux
	return (ut + st) / clkTck, nil
}
