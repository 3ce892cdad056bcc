package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/genericclioptions"
)

// cliGroupVersion is the apiVersion of the results the CLI prints with
// kubectl's printers. No API server serves it: it only names the shape of
// -o json|yaml, so that -o name and jsonpath work as they do on objects.
const cliGroupVersion = "cli.hookwright.io/v1alpha1"

// outputFlags is -o through cli-runtime's PrintFlags, as kubectl parses
// it: json, yaml, name, jsonpath=..., jsonpath-file=..., go-template=...,
// go-template-file=... (and --template); "" is the command's own text.
type outputFlags struct {
	print *genericclioptions.PrintFlags
}

func (o *outputFlags) addFlags(cmd *cobra.Command) {
	o.print = genericclioptions.NewPrintFlags("")
	o.print.AddFlags(cmd)
}

// text tells whether the command prints its own text (no -o).
func (o *outputFlags) text() bool {
	return o.print == nil || o.print.OutputFormat == nil || *o.print.OutputFormat == ""
}

// validate refuses an unknown -o before any cluster is dialed.
func (o *outputFlags) validate() error {
	if o.text() {
		return nil
	}
	_, err := o.print.ToPrinter()
	return err
}

// printList prints items as a List of kind kind (apiVersion
// cliGroupVersion), each item's metadata.name from name(i). Items are
// marshalled to JSON objects and given apiVersion and kind.
func (o *outputFlags) printList(w io.Writer, kind string, n int, item func(i int) any, name func(i int) string) error {
	p, err := o.print.ToPrinter()
	if err != nil {
		return err
	}
	list := &unstructured.UnstructuredList{Object: map[string]any{"apiVersion": "v1", "kind": "List", "metadata": map[string]any{}}}
	for i := range n {
		b, err := json.Marshal(item(i))
		if err != nil {
			return err
		}
		m := map[string]any{}
		if err := json.Unmarshal(b, &m); err != nil {
			return err
		}
		m["apiVersion"], m["kind"] = cliGroupVersion, kind
		m["metadata"] = map[string]any{"name": name(i)}
		list.Items = append(list.Items, unstructured.Unstructured{Object: m})
	}
	if err := p.PrintObj(list, w); err != nil {
		return fmt.Errorf("printing: %w", err)
	}
	return nil
}
