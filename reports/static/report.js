/* Draws each class's latency chart with uPlot (embedded above), from the JSON beside it.
   Charts are drawn when they come near the viewport, so a 1,000-class page opens fast; printing
   draws them all, and `?charts=all` in the URL draws them all at load (the browser test). */
(function () {
  "use strict";
  var COLORS = { baseline: "#57606a", candidate: ["#0969da", "#bf3989", "#1a7f37", "#9a6700"] };

  function pct(nines) {
    var p = 100 * (1 - Math.pow(10, -nines));
    if (p <= 0) return "0%";
    var digits = Math.max(0, Math.ceil(nines) - 2);
    return p.toFixed(digits) + "%";
  }

  // Log-axis ends on 1-2-5 steps, so the first and last ticks read as round numbers.
  function nice(v, up) {
    var mag = Math.pow(10, Math.floor(Math.log10(v))), steps = [1, 2, 5, 10], i;
    if (up) { for (i = 0; i < steps.length; i++) if (steps[i] * mag >= v) return steps[i] * mag; }
    for (i = steps.length - 1; i >= 0; i--) if (steps[i] * mag <= v) return steps[i] * mag;
    return mag;
  }

  function splits(max) {
    var out = [0, Math.log10(2)];
    for (var k = 1; k <= Math.floor(max + 1e-9); k++) out.push(k);
    return out;
  }

  function markers(u, data, colors) {
    var ctx = u.ctx, top = u.bbox.top, bottom = u.bbox.top + u.bbox.height;
    var left = u.bbox.left, right = u.bbox.left + u.bbox.width;
    var dpr = window.devicePixelRatio || 1;
    ctx.save();
    ctx.font = (11 * dpr) + "px sans-serif";
    ctx.lineWidth = dpr;
    // Guide lines at 50 % and 99 %.
    [[Math.log10(2), "p50"], [2, "p99"]].forEach(function (g) {
      if (g[0] > data.nines_max + 1e-9) return;
      var x = u.valToPos(g[0], "x", true);
      ctx.strokeStyle = "#d0d7de";
      ctx.setLineDash([]);
      ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, bottom); ctx.stroke();
      ctx.fillStyle = "#6b7280";
      ctx.fillText(g[1], x + 3 * dpr, bottom - 4 * dpr);
    });
    // The p99 budget.
    if (data.budget !== null) {
      var yb = u.valToPos(data.budget, "y", true);
      ctx.strokeStyle = "#b42318";
      ctx.setLineDash([6 * dpr, 4 * dpr]);
      ctx.beginPath(); ctx.moveTo(left, yb); ctx.lineTo(right, yb); ctx.stroke();
      ctx.fillStyle = "#b42318";
      ctx.textAlign = "right";
      ctx.fillText("p99 budget " + data.budget + " ms", right - 4 * dpr, yb - 4 * dpr);
      ctx.textAlign = "left";
    }
    ctx.setLineDash([]);
    // Per series: p50 and p99 points, and the p99 confidence interval as an error bar at 99 %.
    data.series.forEach(function (s, i) {
      var color = colors[i];
      var off = (i - (data.series.length - 1) / 2) * 6 * dpr;
      var x99 = u.valToPos(Math.min(2, data.nines_max), "x", true) + off;
      ctx.strokeStyle = color; ctx.fillStyle = color;
      if (s.lo !== null && s.hi !== null) {
        var y0 = u.valToPos(s.lo, "y", true), y1 = u.valToPos(s.hi, "y", true);
        ctx.lineWidth = 2 * dpr;
        ctx.beginPath();
        ctx.moveTo(x99, y0); ctx.lineTo(x99, y1);
        ctx.moveTo(x99 - 4 * dpr, y0); ctx.lineTo(x99 + 4 * dpr, y0);
        ctx.moveTo(x99 - 4 * dpr, y1); ctx.lineTo(x99 + 4 * dpr, y1);
        ctx.stroke();
        ctx.lineWidth = dpr;
      }
      [[Math.log10(2), s.p50], [Math.min(2, data.nines_max), s.p99]].forEach(function (pt) {
        var x = u.valToPos(pt[0], "x", true) + (pt[0] === Math.log10(2) ? 0 : off);
        var y = u.valToPos(pt[1], "y", true);
        ctx.beginPath(); ctx.arc(x, y, 3.5 * dpr, 0, 2 * Math.PI); ctx.fill();
      });
    });
    ctx.restore();
  }

  function draw(el) {
    if (el.getAttribute("data-drawn")) return;
    el.setAttribute("data-drawn", "1");
    var src = document.getElementById(el.getAttribute("data-src"));
    var data = JSON.parse(src.textContent);
    var n = data.points, xs = new Array(n);
    for (var i = 0; i < n; i++) xs[i] = n > 1 ? (data.nines_max * i) / (n - 1) : 0;
    var ymax = data.budget || 0, ymin = Infinity;
    var cand = 0;
    var colors = data.series.map(function (s) {
      return s.role === "baseline" ? COLORS.baseline : COLORS.candidate[cand++ % COLORS.candidate.length];
    });
    data.series.forEach(function (s) {
      s.y.concat([s.p50, s.p99, s.lo, s.hi]).forEach(function (v) {
        if (v === null || !(v > 0)) return;
        if (v > ymax) ymax = v;
        if (v < ymin) ymin = v;
      });
    });
    var series = [{ label: "percentile", value: function (u, v) { return v === null ? "--" : pct(v); } }];
    data.series.forEach(function (s, i) {
      series.push({
        label: s.label, stroke: colors[i], width: 2, spanGaps: false,
        value: function (u, v) { return v === null ? "--" : v + " ms"; }
      });
    });
    var width = Math.max(320, el.clientWidth || 560);
    var opts = {
      width: width, height: 300, series: series,
      legend: { live: false },
      cursor: { drag: { x: false, y: false } },
      // Log latency axis: a budget far above the measured latencies must not flatten the curves.
      scales: {
        x: { time: false, range: [0, data.nines_max] },
        y: { distr: 3, log: 10, range: [nice(ymin === Infinity ? 0.001 : ymin / 1.2, false), nice(ymax * 1.2, true)] }
      },
      axes: [
        { label: "percentile", splits: function () { return splits(data.nines_max); },
          values: function (u, vals) { return vals.map(pct); } },
        { label: "latency (ms, log scale)", size: 60 }
      ],
      hooks: { draw: [function (u) { markers(u, data, colors); }] }
    };
    new uPlot(opts, [xs].concat(data.series.map(function (s) { return s.y; })), el);
  }

  function drawAll() {
    var els = document.querySelectorAll(".chart[data-src]");
    for (var i = 0; i < els.length; i++) draw(els[i]);
  }

  var all = /[?&]charts=all(&|$)/.test(window.location.search);
  if (all || !("IntersectionObserver" in window)) {
    drawAll();
  } else {
    var io = new IntersectionObserver(function (entries) {
      entries.forEach(function (e) {
        if (e.isIntersecting) { io.unobserve(e.target); draw(e.target); }
      });
    }, { rootMargin: "600px 0px" });
    document.querySelectorAll(".chart[data-src]").forEach(function (el) { io.observe(el); });
  }
  window.addEventListener("beforeprint", drawAll);
})();
