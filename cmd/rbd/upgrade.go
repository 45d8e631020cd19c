package main

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/rbdb/rbd/storage"
)

type upgradeOptions struct {
	json bool
}

func newUpgradeCommand() *cobra.Command {
	o := &upgradeOptions{}
	cmd := &cobra.Command{
		Use:   "upgrade DIR",
		Short: "Convert a data dir's memmap buffers to rows.meta version 2 and dense tail files (exit 0 upgraded, 1 refused or failed)",
		Long: `upgrade converts every memmap buffer of a stopped data dir whose rows.meta is
format version 1 (a 64-byte record per slot) to version 2 (16 bytes a slot
and a run log; the buffer's spec gets "row_meta": "runs"), and whose final
observations are kept at the slot (tail files of builds before 2026-11-27)
to dense tail files (version 2). Rows, links, streams and counters stay as
they are, and the dir is read back at the end.

It refuses, and changes nothing, a dir a running server holds, one of a
newer format, one that verify finds damaged, and one with nothing to
upgrade. Killed at any point, it leaves rows.meta in version 1 or 2 and
the tail files all in one version, never a mix: the next open finishes or
undoes what it was doing, and upgrade run again does the rest. Builds from
before version 2 cannot open an upgraded buffer.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runUpgrade(cmd.OutOrStdout(), cmd.ErrOrStderr(), args[0], o)
		},
	}
	cmd.Flags().BoolVar(&o.json, "json", false, "print the report as JSON")
	return cmd
}

func runUpgrade(out, errOut io.Writer, dir string, o *upgradeOptions) error {
	rep, err := storage.Upgrade(dir, &storage.UpgradeOptions{
		Store:    &storage.Options{LockTimeout: 100 * time.Millisecond},
		Progress: func(msg string) { fmt.Fprintln(errOut, msg) },
	})
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	if o.json {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	for _, b := range rep.Buffers {
		fmt.Fprintf(out, "buffer %q: %d rows, %d run records; row metadata on disk %d bytes -> %d (rows.meta and the run log)",
			b.Name, b.Rows, b.RunRecords, b.MetaBytesBefore, b.MetaBytesAfter)
		if b.Tails > 0 {
			fmt.Fprintf(out, "; %d final observations, tail files %d bytes -> %d", b.Tails, b.TailBytesBefore, b.TailBytesAfter)
		}
		fmt.Fprintln(out)
	}
	return nil
}
