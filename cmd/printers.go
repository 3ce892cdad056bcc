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

// printObject prints v as one item of kind kind named name (see printList).
func (o *outputFlags) printObject(w io.Writer, kind, name string, v any) error {
	p, err := o.print.ToPrinter()
	if err != nil {
		return err
	}
	u, err := toItem(kind, name, v)
	if err != nil {
		return err
	}
	if err := p.PrintObj(u, w); err != nil {
		return fmt.Errorf("printing: %w", err)
	}
	return nil
}

// toItem is v's JSON object with apiVersion cliGroupVersion, kind and
// metadata.name.
func toItem(kind, name string, v any) (*unstructured.Unstructured, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	m := map[string]any{}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	m["apiVersion"], m["kind"] = cliGroupVersion, kind
	m["metadata"] = map[string]any{"name": name}
	return &unstructured.Unstructured{Object: m}, nil
}

// printList prints n items as a List (apiVersion v1) of items of kind
// kind (apiVersion cliGroupVersion), item i being item(i)'s JSON object
// with metadata.name name(i).
func (o *outputFlags) printList(w io.Writer, kind string, n int, item func(i int) any, name func(i int) string) error {
	p, err := o.print.ToPrinter()
	if err != nil {
		return err
	}
	list := &unstructured.UnstructuredList{Object: map[string]any{"apiVersion": "v1", "kind": "List", "metadata": map[string]any{}}}
	for i := range n {
		u, err := toItem(kind, name(i), item(i))
		if err != nil {
			return err
		}
		list.Items = append(list.Items, *u)
	}
	if err := p.PrintObj(list, w); err != nil {
		return fmt.Errorf("printing: %w", err)
	}
	return nil
}
