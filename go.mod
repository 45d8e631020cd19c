module github.com/rbdb/rbd

go 1.26.0

require (
	github.com/edsrzf/mmap-go v1.2.0
	golang.org/x/sys v0.49.0
)

require gonum.org/v1/gonum v0.17.0

require (
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/spf13/cobra v1.10.2 // indirect
	github.com/spf13/pflag v1.0.10 // indirect
	go.etcd.io/bbolt v1.5.0 // indirect
)
