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
	json    bool
	rowMeta string
}

func newUpgradeCommand() *cobra.Command {
	o := &upgradeOptions{}
	cmd := &cobra.Command{
		Use:   "upgrade DIR",
		Short: "Convert a data dir's memmap buffers to rows.meta format version 3 (or 2) (exit 0 upgraded, 1 refused or failed)",
		Long: `upgrade converts the memmap buffers of a stopped data dir whose rows.meta is
format version 1 (a 64-byte record per slot) or 2 (16 bytes a slot and a run
log) to version 3 (no record per row: block checksums, a run log and dense
tail files; the buffer's spec gets "row_meta": "blocks", the default of new
memmap buffers that are not fsync and hold 1,024 rows or more; see
--row-meta for the others). Rows, links, streams and counters stay as they are, and the
dir is read back at the end: every live row's fields, metadata, final
observation and priority must read as before.

The version 3 files are written as a whole buffer dir beside each buffer's
(buffers/.upgrade-v3.<name>), every buffer's before the first switch, so
the upgrade needs about as much free disk as the buffers it converts take
together; then the catalog switches each buffer, and its old files go to
the trash.

--row-meta runs converts to version 2 instead, as builds from 2026-11-27
to 2026-11-28 did (rows.meta version 2 and dense tail files): builds
before 2026-11-29 cannot open version 3. Left out, --row-meta converts each
buffer to what a new buffer of its spec gets: fsync buffers and rings under
1,024 rows go to (or stay in) version 2, since in version 3 an open after a
power loss leaves the block being filled and evicts up to 63 of the oldest rows
(every row of a ring under 64), where version 2 keeps every row an fsync
writer acknowledged; --row-meta blocks converts them to version 3 anyway.

It refuses, and changes nothing, a dir a running server holds, one of a
newer format, one that verify finds damaged, and one with nothing to
upgrade. Killed at any point, it leaves each buffer in its old version or
its new one, never a mix: the next open finishes or undoes what it was
doing, and upgrade run again does the rest.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runUpgrade(cmd.OutOrStdout(), cmd.ErrOrStderr(), args[0], o)
		},
	}
	cmd.Flags().BoolVar(&o.json, "json", false, "print the report as JSON")
	cmd.Flags().StringVar(&o.rowMeta, "row-meta", "", `the layout to convert to: "blocks" (rows.meta format version 3, every memmap buffer) or "runs" (version 2); left out, each buffer to what a new buffer of its spec gets (version 3, version 2 for fsync buffers and rings under 1,024 rows)`)
	return cmd
}

func runUpgrade(out, errOut io.Writer, dir string, o *upgradeOptions) error {
	rep, err := storage.Upgrade(dir, &storage.UpgradeOptions{
		RowMeta:  storage.RowMetaLayout(o.rowMeta),
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
		fmt.Fprintf(out, "buffer %q: rows.meta format version %d: %d rows, %d run records; row metadata on disk %d bytes -> %d (rows.meta and the run log)",
			b.Name, b.FormatVersion, b.Rows, b.RunRecords, b.MetaBytesBefore, b.MetaBytesAfter)
		if b.Tails > 0 {
			fmt.Fprintf(out, "; %d final observations, tail files %d bytes -> %d", b.Tails, b.TailBytesBefore, b.TailBytesAfter)
		}
		if b.BytesBefore > 0 {
			fmt.Fprintf(out, "; all files %d bytes -> %d", b.BytesBefore, b.BytesAfter)
		}
		fmt.Fprintln(out)
	}
	return nil
}
