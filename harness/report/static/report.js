/* swa-graph-harness report: filter, sort, copy. Plain DOM, no network, no dependency. */
(function () {
  "use strict";

  function all(selector, root) {
    return Array.prototype.slice.call((root || document).querySelectorAll(selector));
  }

  /* ---- filter (index page): family, design, mode, verdict, backend; the runs table in pages ---- */
  var repaginate = function () {};
  var form = document.getElementById("filter-form");
  if (form) {
    var dataNode = document.getElementById("report-data");
    var runs = dataNode ? JSON.parse(dataNode.textContent).runs : [];
    var selects = all("select[data-filter]", form);

    var current = function () {
      var f = {};
      selects.forEach(function (s) { if (s.value) { f[s.getAttribute("data-filter")] = s.value; } });
      return f;
    };
    var keeps = function (f, get) {
      for (var key in f) {
        if (!Object.prototype.hasOwnProperty.call(f, key)) { continue; }
        if (key === "verdict") {
          if (f.verdict === "unexpected" ? get("status") !== "unexpected" : get("verdict") !== f.verdict) { return false; }
        } else if (get(key) !== f[key]) {
          return false;
        }
      }
      return true;
    };
    var fromElement = function (el) { return function (key) { return el.getAttribute("data-" + key); }; };

    /* the library has well over a thousand runs: the filter chooses rows, the pager shows them a page at a time */
    var runsTable = document.getElementById("runs-table");
    var pageSize = runsTable ? parseInt(runsTable.getAttribute("data-page-size"), 10) || 0 : 0;
    var pageIndex = 0;
    var showAll = false;
    var pager = document.getElementById("runs-pager");
    repaginate = function () {
      var kept = all("tr[data-run]").filter(function (tr) { return !tr.hasAttribute("data-filtered-out"); });
      var paged = pageSize > 0 && !showAll && kept.length > pageSize;
      var pages = paged ? Math.ceil(kept.length / pageSize) : 1;
      pageIndex = Math.min(pageIndex, pages - 1);
      all("tr[data-run]").forEach(function (tr) { tr.hidden = tr.hasAttribute("data-filtered-out"); });
      if (paged) {
        kept.forEach(function (tr, i) { tr.hidden = Math.floor(i / pageSize) !== pageIndex; });
      }
      if (!pager) { return; }
      pager.hidden = pageSize === 0 || kept.length <= pageSize;
      var first = paged ? pageIndex * pageSize + 1 : 1;
      var last = paged ? Math.min(kept.length, (pageIndex + 1) * pageSize) : kept.length;
      document.getElementById("runs-page").textContent = "rows " + first + "\u2013" + last + " of " + kept.length;
      document.getElementById("runs-prev").disabled = !paged || pageIndex === 0;
      document.getElementById("runs-next").disabled = !paged || pageIndex === pages - 1;
      document.getElementById("runs-all").textContent = showAll ? "show " + pageSize + " at a time" : "show all";
    };
    if (pager) {
      document.getElementById("runs-prev").addEventListener("click", function () { pageIndex -= 1; repaginate(); });
      document.getElementById("runs-next").addEventListener("click", function () { pageIndex += 1; repaginate(); });
      document.getElementById("runs-all").addEventListener("click", function () { showAll = !showAll; pageIndex = 0; repaginate(); });
    }

    var apply = function () {
      var f = current();
      all("tr[data-run]").forEach(function (tr) {
        if (keeps(f, fromElement(tr))) { tr.removeAttribute("data-filtered-out"); } else { tr.setAttribute("data-filtered-out", ""); }
      });
      pageIndex = 0;
      repaginate();
      all("tr[data-scenario]").forEach(function (tr) { tr.hidden = !!f.family && tr.getAttribute("data-family") !== f.family; });
      all("table.matrix").forEach(function (table) {
        var columnsShown = function (el) {
          return (!f.design || el.getAttribute("data-design") === f.design) && (!f.mode || el.getAttribute("data-mode") === f.mode);
        };
        all("[data-col]", table).forEach(function (el) { el.hidden = !columnsShown(el); });
        all("th[data-design-head]", table).forEach(function (th) {
          var design = th.getAttribute("data-design-head");
          var shown = all("th.mode-head", table).filter(function (h) {
            return h.getAttribute("data-design") === design && !h.hidden;
          }).length;
          th.hidden = shown === 0;
          th.colSpan = Math.max(shown, 1);
        });
        all("tr[data-matrix-row]", table).forEach(function (tr) {
          var any = false;
          all("td[data-cell]", tr).forEach(function (td) {
            var match = keeps(f, fromElement(td));
            td.classList.toggle("dim", !match);
            if (match && !td.hidden) { any = true; }
          });
          tr.hidden = !any;
        });
      });
      var shown = runs.filter(function (r) { return keeps(f, function (key) { return r[key]; }); });
      var byVerdict = {};
      shown.forEach(function (r) { byVerdict[r.verdict] = (byVerdict[r.verdict] || 0) + 1; });
      var parts = Object.keys(byVerdict).sort().map(function (v) { return byVerdict[v] + " " + v; });
      var count = document.getElementById("filter-count");
      count.textContent = (Object.keys(f).length ? "showing " + shown.length + " of " + runs.length + " runs" : runs.length + " runs") +
        (parts.length ? ": " + parts.join(", ") : "");
      var hash = Object.keys(f).map(function (k) { return encodeURIComponent(k) + "=" + encodeURIComponent(f[k]); }).join("&");
      if (window.history && window.history.replaceState) {
        try { window.history.replaceState(null, "", hash ? "#" + hash : window.location.pathname); } catch (e) { /* file:// in some browsers */ }
      }
    };

    /* a filtered view can be shared as a link: index.html#verdict=diverge&family=swa_decode_ */
    var fromHash = function (hash) {
      var h = hash.replace(/^#/, "");
      h.split("&").forEach(function (pair) {
        var kv = pair.split("=");
        if (kv.length !== 2) { return; }
        var key, value;
        try { key = decodeURIComponent(kv[0]); value = decodeURIComponent(kv[1]); } catch (e) { return; }
        selects.forEach(function (s) {
          if (s.getAttribute("data-filter") === key && all("option", s).some(function (o) { return o.value === value; })) { s.value = value; }
        });
      });
    };

    /* a link to a filtered view on the page itself (the banner's groups): filter, then show the runs table */
    var follow = function (hash) {
      selects.forEach(function (s) { s.value = ""; });
      fromHash(hash);
      apply();
      if (runsTable) { runsTable.scrollIntoView(); }
    };
    all("a[data-filter-link]").forEach(function (a) {
      a.addEventListener("click", function (e) { e.preventDefault(); follow(a.getAttribute("href")); });
    });
    window.addEventListener("hashchange", function () {
      if (window.location.hash.indexOf("=") >= 0) { follow(window.location.hash); }
    });

    selects.forEach(function (s) { s.addEventListener("change", apply); });
    form.addEventListener("reset", function () { window.setTimeout(apply, 0); });
    fromHash(window.location.hash);
    apply();
  }

  /* ---- sortable tables: click a header; numbers sort as numbers ---- */
  all("table.sortable").forEach(function (table) {
    all("thead th[data-sort]", table).forEach(function (th, column) {
      th.tabIndex = 0;
      th.setAttribute("role", "button");
      var sort = function () {
        var numeric = th.getAttribute("data-sort") === "num";
        var ascending = th.getAttribute("aria-sort") !== "ascending";
        all("thead th", table).forEach(function (other) { other.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        var key = function (row) {
          var cell = row.cells[column];
          var text = cell ? (cell.getAttribute("data-value") || cell.textContent.trim()) : "";
          if (!numeric) { return text; }
          var n = parseFloat(text);
          return isNaN(n) ? -Infinity : n;
        };
        rows.sort(function (a, b) {
          var x = key(a), y = key(b);
          var c = numeric ? x - y : String(x).localeCompare(String(y), undefined, {numeric: true});
          return ascending ? c : -c;
        });
        rows.forEach(function (row) { body.appendChild(row); });
        if (table.id === "runs-table") { repaginate(); }
      };
      th.addEventListener("click", sort);
      th.addEventListener("keydown", function (e) { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sort(); } });
    });
  });

  /* ---- copy buttons: the clipboard API where the page may use it, else a selection and execCommand ---- */
  var flash = function (button, text) {
    var before = button.textContent;
    button.textContent = text;
    window.setTimeout(function () { button.textContent = before; }, 1200);
  };
  var fallbackCopy = function (text) {
    var area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.style.position = "fixed";
    area.style.opacity = "0";
    document.body.appendChild(area);
    area.select();
    var ok = false;
    try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
    document.body.removeChild(area);
    return ok;
  };
  all("button.copy").forEach(function (button) {
    button.addEventListener("click", function () {
      var text = button.getAttribute("data-copy");
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(text).then(function () { flash(button, "copied"); },
          function () { flash(button, fallbackCopy(text) ? "copied" : "select and copy"); });
      } else {
        flash(button, fallbackCopy(text) ? "copied" : "select and copy");
      }
    });
  });

  /* ---- a link to a run opens its section ---- */
  var openTarget = function () {
    var id = window.location.hash.replace(/^#/, "");
    if (!id || id.indexOf("=") >= 0) { return; }
    var target = document.getElementById(id);
    if (target) {
      var details = target.querySelector("details");
      if (details) { details.open = true; }
    }
  };
  window.addEventListener("hashchange", openTarget);
  openTarget();
})();
