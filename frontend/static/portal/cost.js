// The team cost page's chart: spend per UTC day, stacked by deployment, from the figures the page embeds
// (json_script); the tables beside it carry the same numbers without JavaScript.
(function () {
  "use strict";
  var COLOURS = ["#4338ca", "#059669", "#d97706", "#dc2626", "#0891b2", "#7c3aed", "#475467", "#db2777"];
  function draw() {
    var data = document.getElementById("spend-data"), canvas = document.getElementById("spend-chart");
    if (!data || !canvas || typeof Chart === "undefined") return;
    var spend = JSON.parse(data.textContent);
    var chart = new Chart(canvas, {
      type: "bar",
      data: { labels: spend.labels, datasets: spend.series.map(function (s, i) {
        return { label: s.name, data: s.usd, backgroundColor: COLOURS[i % COLOURS.length], stack: "usd" };
      }) },
      options: {
        maintainAspectRatio: false, animation: false, interaction: { mode: "index", intersect: false },
        scales: { x: { stacked: true, ticks: { maxRotation: 0 } },
                  y: { stacked: true, beginAtZero: true, title: { display: true, text: "USD per day" } } },
        plugins: { legend: { position: "bottom", labels: { boxWidth: 10, boxHeight: 10 } },
                   tooltip: { callbacks: { label: function (c) { return c.dataset.label + ": $" + c.parsed.y.toFixed(2); } } } }
      }
    });
    window.tandemCharts = window.tandemCharts || {};
    window.tandemCharts.spend = chart;
    canvas.closest("[data-spend-panel]").setAttribute("data-rendered", "true");
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", draw); else draw();
})();
