// Command echoargs prints its arguments, one per line: the binary
// BuildBinaries's test builds.
package main

import (
	"fmt"
	"os"
)

func main() {
	for _, a := range os.Args[1:] {
		fmt.Println(a)
	}
}
