package main

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/rbdb/rbd/storage"
)

type verifyOptions struct {
	json bool
}

func newVerifyCommand() *cobra.Command {
	o := &verifyOptions{}
	cmd := &cobra.Command{
		Use:   "verify DIR",
		Short: "Check a data dir's integrity (exit 0 clean, 1 damage, 2 could not check)",
		Long: `verify checks every buffer of a data dir without changing it: file headers
against the catalog, every record and data checksum in the live window, the
links between rows and the trajectory index rebuilt from them.

A torn tail above a buffer's durable watermark (what a crash leaves) is
normal; a flipped byte anywhere, or acknowledged rows that are missing, is
damage. It works next to a running server (reading the catalog snapshot the
server publishes) and on a dir left by a crash.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return runVerify(cmd.OutOrStdout(), args[0], o) },
	}
	cmd.Flags().BoolVar(&o.json, "json", false, "print the report as JSON")
	return cmd
}

func runVerify(out io.Writer, dir string, o *verifyOptions) error {
	rep, err := storage.Verify(dir, &storage.Options{LockTimeout: 100 * time.Millisecond})
	if err != nil {
		return &exitError{code: 2, err: err}
	}
	if o.json {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		if !rep.SnapshotAt.IsZero() {
			fmt.Fprintf(out, "note: %s is in use; checked against the snapshot its server published %s ago\n", dir, time.Since(rep.SnapshotAt).Round(time.Millisecond))
		}
		for _, b := range rep.Buffers {
			status := "ok"
			if len(b.Problems) > 0 {
				status = fmt.Sprintf("DAMAGED (%d problems)", len(b.Problems))
			}
			fmt.Fprintf(out, "buffer %q (%s): %s — %d live rows, write_count %d, durable below seq %d, %d holes\n",
				b.Name, b.Storage, status, b.LiveRows, b.WriteCount, b.Durable, b.Holes)
			if b.LetGo > 0 {
				fmt.Fprintf(out, "  %d rows let go after a crash: a write that was never acknowledged may have been overwriting them when power was lost (not damage)\n", b.LetGo)
			}
			for i, p := range b.Problems {
				if i == 20 {
					fmt.Fprintf(out, "  ... and %d more\n", len(b.Problems)-20)
					break
				}
				fmt.Fprintf(out, "  - %s\n", p)
			}
		}
		for _, p := range rep.Problems {
			fmt.Fprintf(out, "DAMAGED: %s\n", p)
		}
		if len(rep.Buffers) == 0 && len(rep.Problems) == 0 {
			fmt.Fprintln(out, "no buffers")
		}
	}
	if !rep.OK() {
		return &exitError{code: 1, err: fmt.Errorf("damage found in %s", dir)}
	}
	return nil
}
