"""The presentation layer: what every front end shows, computed once. `headline` formats a
run.json record (standard library only: capture uses it); `view` turns a run's analysis into
rows, cards and lines of text; `payload` is the JSON. No rich, plotly or HTML here: the
renderers in `fsdp_trace.render` lay these out, so terminal, HTML, JSON and compare cannot
disagree."""
