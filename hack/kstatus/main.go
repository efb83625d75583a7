// kstatus prints the kstatus verdict (sigs.k8s.io/cli-utils/pkg/kstatus/status), the library Flux and
// kpt use to decide whether an applied object is ready, for one Kubernetes object read as JSON on stdin:
//
//	{"status": "InProgress|Current|Failed|Terminating|Unknown", "message": "..."}
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "kstatus:", err)
		os.Exit(1)
	}
}

func run(in io.Reader, out io.Writer) error {
	data, err := io.ReadAll(in)
	if err != nil {
		return err
	}
	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(data); err != nil {
		return fmt.Errorf("reading the object: %w", err)
	}
	result, err := status.Compute(obj)
	if err != nil {
		return fmt.Errorf("computing its status: %w", err)
	}
	return json.NewEncoder(out).Encode(map[string]string{
		"status":  result.Status.String(),
		"message": result.Message,
	})
}
