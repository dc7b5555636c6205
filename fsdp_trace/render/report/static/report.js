// report.html: draw every figure stored in the page's JSON payload, then say so on <body>
// (payload.attribute = the number drawn; payload.attribute + "-error" if one failed).
(function () {
  var spec = JSON.parse(document.getElementById("fsdp-figures").textContent);
  var config = {displaylogo: false, responsive: true,
                modeBarButtonsToRemove: ["lasso2d", "select2d", "autoScale2d"],
                toImageButtonOptions: {format: "png", scale: 2}};
  var jobs = spec.figures.map(function (f) {
    var layout = f.figure.layout || {};
    layout.template = spec.template;
    return Plotly.newPlot(document.getElementById(f.id), f.figure.data, layout, config);
  });
  Promise.all(jobs).then(function () {
    document.body.setAttribute(spec.attribute, String(jobs.length));
  }, function (err) {
    document.body.setAttribute(spec.attribute + "-error", String(err));
    throw err;
  });
})();
