package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/rbdb/rbd"
	"github.com/rbdb/rbd/client"
	"github.com/rbdb/rbd/storage"
)

type checkpointOptions struct {
	url     string
	token   string
	data    string
	jsonOut bool
	tls     tlsClientFlags
}

func newCheckpointCommand() *cobra.Command {
	o := &checkpointOptions{}
	cmd := &cobra.Command{
		Use:   "checkpoint (--url URL | --data DIR) BUFFER DEST",
		Short: "Write a hot copy of one buffer that rbd serve --data DEST opens",
		Long: `checkpoint writes a consistent copy of one buffer (any kind, memory included:
rows, trajectories, priorities, streams) into a new data dir, while writers
and samplers go on. ` + "`rbd serve --data DEST`" + ` opens it; ` + "`rbd verify DEST`" + ` checks it.

With --url it asks a running server: DEST is a path under the server's
--checkpoint-root. With --data it copies from a data dir no server has open:
DEST is a path on this machine. DEST must not exist.

The copy holds every row written before its seq (write_count in the
answer). Rows that writers overwrite before the copy reaches them (only
the oldest, when the ring turns faster than the copy) are left out and
counted. A copy cut short (a crash, a kill) is refused when opened.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.token == "" {
				o.token = os.Getenv("RBD_TOKEN")
			}
			return runCheckpoint(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), args[0], args[1], o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.url, "url", "", "the rbd server to ask (e.g. http://127.0.0.1:7450)")
	f.StringVar(&o.token, "token", "", "bearer token for --url (default $RBD_TOKEN)")
	o.tls.addFlags(f)
	f.StringVar(&o.data, "data", "", "copy from this data dir (no server may have it open)")
	f.BoolVar(&o.jsonOut, "json", false, "print the result as JSON")
	return cmd
}

func runCheckpoint(ctx context.Context, stdout, stderr io.Writer, buffer, dest string, o *checkpointOptions) error {
	if (o.url == "") == (o.data == "") {
		return errors.New("checkpoint: give exactly one of --url URL and --data DIR")
	}
	bar := progressbar.NewOptions64(-1,
		progressbar.OptionSetWriter(stderr),
		progressbar.OptionSetVisibility(isTerminal(stderr)),
		progressbar.OptionSetDescription("checkpoint "+buffer),
		progressbar.OptionShowBytes(true),
		progressbar.OptionThrottle(200*time.Millisecond),
		progressbar.OptionClearOnFinish())
	progress := func(done, total int64) {
		bar.ChangeMax64(total)
		_ = bar.Set64(done)
	}
	var res client.CheckpointResult
	if o.url != "" {
		c, err := o.tls.newClient(o.url, o.token)
		if err != nil {
			return err
		}
		if res, err = c.Checkpoint(ctx, buffer, dest, progress); err != nil {
			return err
		}
	} else {
		db, err := rbd.Open(o.data, nil)
		if err != nil {
			return err
		}
		b, err := db.Buffer(buffer)
		if err != nil {
			return errors.Join(err, db.Close())
		}
		sr, err := b.Checkpoint(ctx, dest, &storage.CheckpointOptions{Progress: progress})
		if cerr := db.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		res = client.CheckpointResult(sr)
	}
	_ = bar.Finish()
	if o.jsonOut {
		return json.NewEncoder(stdout).Encode(res)
	}
	fmt.Fprintf(stdout, "checkpoint of %q in %s: %d rows up to seq %d (from %d; %d overwritten while copying), %d bytes in %.2fs\n",
		res.Buffer, dest, res.Rows, res.WriteCount, res.FirstSeq, res.Overwritten, res.Bytes, res.Seconds)
	return nil
}
