// Command lazyfork-helper is started by lazyfork (and its daemon) to become a command
// inside a container; it is found next to the lazyfork binary. Run by hand it does nothing.
// Its code is lib/helper; it imports little so that it starts fast.
package main

import (
	"fmt"
	"os"

	"github.com/lazyfork/lazyfork/lib/helper"
)

func main() {
	helper.Maybe()
	fmt.Fprintln(os.Stderr, "lazyfork-helper: started by lazyfork to run commands inside containers; not a command of its own (use `lazyfork exec`)")
	os.Exit(2)
}
