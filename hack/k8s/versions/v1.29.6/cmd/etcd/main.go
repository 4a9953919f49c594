// Command etcd runs the etcd server at the version that our pinned Kubernetes
// release requires (see ../../go.mod); it only hands its arguments to etcdmain.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
