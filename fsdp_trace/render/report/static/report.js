// report.html: draw every figure stored in the page's packed JSON payload (unpacked by
// fsdpUnpack, defined with plotly.js above this script), then say so on <body>
// (payload.attribute = the number drawn; "data-fsdp-rendered-error" if one failed or plotly.js
// is missing).
(function () {
  var failed = "data-fsdp-rendered-error";
  if (typeof Plotly === "undefined" || typeof fsdpUnpack === "undefined") {
    document.body.setAttribute(failed, "plotly.js was not loaded");
    return;
  }
  var spec = JSON.parse(fsdpUnpack.text(document.getElementById("fsdp-figures")));
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
