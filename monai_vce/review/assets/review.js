/* monai-vce review pages: the exam index and the exam review page.
 *
 * Plain JavaScript, no library, no network: the data comes from scripts written next to the pages
 * (window.VCE_INDEX, window.VCE_EXAM), so the pages open from disk. Text from the data (video ids, labels,
 * file names) is only ever inserted with textContent or as attribute values, never as markup.
 * The review state of each exam lives in the browser's localStorage under "vce-review:<state key>".
 */
(function () {
  "use strict";

  var STORE_PREFIX = "vce-review:";
  var STATE_VERSION = 1;

  // ------------------------------------------------------------------------------------------- helpers
  function el(tag, props, children) {
    var node = document.createElement(tag);
    if (props) {
      Object.keys(props).forEach(function (k) {
        var v = props[k];
        if (v === undefined || v === null) return;
        if (k === "text") node.textContent = v;
        else if (k === "className") node.className = v;
        else if (k === "dataset") Object.keys(v).forEach(function (d) { node.dataset[d] = v[d]; });
        else if (k.slice(0, 2) === "on") node.addEventListener(k.slice(2), v);
        else node.setAttribute(k, v);
      });
    }
    (children || []).forEach(function (c) {
      if (c === null || c === undefined) return;
      node.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    });
    return node;
  }

  function bytesFromB64(s) {
    var bin = atob(s);
    var out = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }

  function int32FromB64(s) {
    var b = bytesFromB64(s);
    return new Int32Array(b.buffer, b.byteOffset, b.byteLength / 4);
  }

  function intArray(spec) {
    if (spec.b64 !== undefined) return int32FromB64(spec.b64);
    var out = new Int32Array(spec.n);
    for (var i = 0; i < spec.n; i++) out[i] = spec.start + i * spec.step;
    return out;
  }

  function fmt(n) { return Number(n).toLocaleString("en-US"); }

  function fmtDuration(sec) {
    if (sec < 60) return sec.toFixed(sec < 10 ? 1 : 0) + " s";
    var m = Math.floor(sec / 60), s = Math.round(sec - 60 * m);
    if (m < 60) return m + " min " + s + " s";
    return Math.floor(m / 60) + " h " + (m % 60) + " min";
  }

  function clock(sec) {
    var h = Math.floor(sec / 3600), m = Math.floor((sec % 3600) / 60), s = Math.floor(sec % 60);
    var mm = (h ? String(m).padStart(2, "0") : String(m));
    return (h ? h + ":" : "") + mm + ":" + String(s).padStart(2, "0");
  }

  // first index i with a[i] >= x (a sorted)
  function lowerBound(a, x) {
    var lo = 0, hi = a.length;
    while (lo < hi) { var mid = (lo + hi) >>> 1; if (a[mid] < x) lo = mid + 1; else hi = mid; }
    return lo;
  }

  function nearest(a, x) {
    if (!a.length) return -1;
    var i = lowerBound(a, x);
    if (i >= a.length) return a[a.length - 1];
    if (i > 0 && x - a[i - 1] <= a[i] - x) return a[i - 1];
    return a[i];
  }

  function safeFileName(s) {
    var t = String(s).replace(/[^A-Za-z0-9._-]+/g, "_").replace(/^[._]+|[._]+$/g, "");
    return t || "video";
  }

  function download(name, text, mime) {
    var blob = new Blob([text], { type: mime });
    var url = URL.createObjectURL(blob);
    var a = el("a", { href: url, download: name });
    a.style.display = "none";
    document.body.appendChild(a);
    a.click();
    setTimeout(function () { URL.revokeObjectURL(url); a.remove(); }, 1000);
  }

  function loadState(key) {
    try {
      var raw = window.localStorage.getItem(STORE_PREFIX + key);
      if (!raw) return null;
      var st = JSON.parse(raw);
      return st && st.version === STATE_VERSION ? st : null;
    } catch (e) {
      return null;
    }
  }

  function saveState(key, state) {
    try {
      window.localStorage.setItem(STORE_PREFIX + key, JSON.stringify(state));
      return true;
    } catch (e) {
      return false;
    }
  }

  function reviewCounts(events) {
    var c = { total: 0, reviewed: 0, accepted: 0, rejected: 0, added: 0 };
    events.forEach(function (ev) {
      if (ev.added) { if (ev.status !== "rejected") c.added++; return; }
      c.total++;
      if (ev.status !== "pending") c.reviewed++;
      if (ev.status === "accepted") c.accepted++;
      if (ev.status === "rejected") c.rejected++;
    });
    return c;
  }

  // events as exported: predicted ones in confidence order (rejected left out; unreviewed ones only with
  // includePending), then the added ones in the order they were made
  function exportedEvents(events, includePending) {
    return events.filter(function (ev) {
      if (ev.status === "rejected") return false;
      return ev.added || ev.status === "accepted" || includePending;
    }).map(function (ev) {
      // label names sorted as the challenge's ground truth lists them
      var lab = ev.label.slice().sort();
      return { start: ev.start, end: ev.end, label: lab };
    });
  }

  function initialEvents(list) {
    return list.map(function (e, i) {
      return { k: i, label: e.label.slice(), start: e.start, end: e.end, s: e.s, e: e.e,
               score: typeof e.score === "number" ? e.score : null,
               status: "pending", added: false, edited: false };
    });
  }

  // ------------------------------------------------------------------------------------------- index page
  function renderIndex(idx) {
    document.title = "VCE review: " + idx.exams.length + " exams";
    var body = document.body;
    var header = el("header", { className: "topbar" }, [
      el("h1", { text: "Capsule exam review" }),
      el("span", { className: "muted", text: idx.exams.length + " exams · events from " + idx.prediction +
        " · frames in " + (idx.units === "frame_index" ? "frame index" : "frame number") + " units" })
    ]);
    var table = el("table", { className: "exam-table" });
    var head = el("tr", null, ["Exam", "Frames", "Duration", "Events", "Predicted labels", "Reviewed", ""].map(
      function (h) { return el("th", { text: h }); }));
    table.appendChild(el("thead", null, [head]));
    var tbody = el("tbody");
    var all = [];
    idx.exams.forEach(function (ex) {
      var st = loadState(ex.state_key);
      var events = st ? st.events : initialEvents(ex.events.map(function (e) {
        return { start: e.start, end: e.end, label: e.label, s: 0, e: 0 };
      }));
      all.push({ video_id: ex.video_id, events: events });
      var c = reviewCounts(events);
      var chips = el("div", { className: "chips" }, ex.labels.map(function (n) {
        return el("span", { className: "chip " + (idx.labels.indexOf(n) >= 8 ? "chip-path" : "chip-anat"), text: n });
      }));
      var pct = c.total ? Math.round(100 * c.reviewed / c.total) : 100;
      var progress = el("div", { className: "progress" }, [
        el("div", { className: "progress-bar" }, [el("div", { className: "progress-fill", style: "width:" + pct + "%" })]),
        el("span", { text: c.reviewed + " / " + c.total + (c.added ? " · +" + c.added + " added" : "") })
      ]);
      var link = el("a", { href: ex.page, className: "button primary", text: "Review" });
      var name = el("a", { href: ex.page, className: "exam-name", text: ex.video_id });
      var dur = ex.duration_seconds != null ? fmtDuration(ex.duration_seconds) : "–";
      tbody.appendChild(el("tr", { className: "exam-row", dataset: { video: ex.video_id } }, [
        el("td", null, [name]), el("td", { className: "num", text: fmt(ex.num_frames) }),
        el("td", { className: "num", text: dur }), el("td", { className: "num", text: fmt(ex.events.length) }),
        el("td", null, [chips]), el("td", null, [progress]), el("td", null, [link])
      ]));
    });
    table.appendChild(tbody);
    var include = el("input", { type: "checkbox", id: "include-pending", checked: "checked" });
    var exportAll = el("button", { className: "button", id: "export-all", text: "Export all reviewed events (JSON)",
      onclick: function () {
        var out = { videos: all.map(function (v) {
          return { video_id: v.video_id, events: exportedEvents(v.events, include.checked) };
        }) };
        download("reviewed_events.json", JSON.stringify(out, null, 2) + "\n", "application/json");
      } });
    var tools = el("div", { className: "index-tools" }, [exportAll,
      el("label", { className: "check" }, [include, " include unreviewed events as predicted"])]);
    body.appendChild(header);
    body.appendChild(el("main", { className: "index-main" }, [tools, table,
      el("p", { className: "muted small", text: "Review progress is kept in this browser (local storage). " +
        "Open an exam, review its events, and export the corrected events (JSON) and labels (Galar CSV) from its page." })]));
    body.dataset.ready = "1";
  }

  // ------------------------------------------------------------------------------------------- exam page
  function ExamPage(data) {
    var self = this;
    this.d = data;
    this.T = data.num_frames;
    this.labels = data.labels;
    this.L = data.labels.length;
    this.labelIndex = {};
    data.labels.forEach(function (n, i) { self.labelIndex[n] = i; });
    this.frameIndex = intArray(data.frame_index);
    this.frameNumber = intArray(data.frame_number);
    this.ids = data.units === "frame_index" ? this.frameIndex : this.frameNumber;
    this.probs = data.probs ? bytesFromB64(data.probs) : null;
    this.thumbRows = int32FromB64(data.thumbs.rows);
    this.storedRows = data.frames.kind === "stored" ? int32FromB64(data.frames.rows) : null;
    this.unitName = data.units === "frame_index" ? "frame index" : "frame number";
    this.gt = data.gt || null;
    this.thumbsByEvent = {};
    data.events.forEach(function (e, i) {
      if (e.thumbs) self.thumbsByEvent[i] = { rows: e.thumbs, peak: e.peak };
    });
    var st = loadState(data.state_key);
    this.state = st || { version: STATE_VERSION, video_id: data.video_id, events: initialEvents(data.events),
                         nextKey: data.events.length, newLabel: null, autoAdvance: true, includePending: true };
    this.undoStack = [];
    this.sel = -1;            // position in this.state.events of the selected event
    this.frame = 0;           // the row shown in the viewer
    this.filter = "all";
    this.view = { r0: 0, r1: Math.max(1, this.T) };
    this.dirty = true;
    this.renderedCards = 0;
    this.build();
    var first = this.visibleEvents()[0];
    if (first !== undefined) this.select(first, true);
    else this.setFrame(0);
    this.fitView();
    document.body.dataset.ready = "1";
  }

  ExamPage.prototype.save = function () {
    this.state.updated = new Date().toISOString();
    if (!saveState(this.d.state_key, this.state)) this.flash("Review state could not be saved in this browser");
  };

  ExamPage.prototype.pushUndo = function () {
    this.undoStack.push(JSON.stringify(this.state.events));
    if (this.undoStack.length > 200) this.undoStack.shift();
  };

  ExamPage.prototype.undo = function () {
    if (!this.undoStack.length) { this.flash("Nothing to undo"); return; }
    this.state.events = JSON.parse(this.undoStack.pop());
    if (this.sel >= this.state.events.length) this.sel = this.state.events.length - 1;
    this.changed(true);
    this.flash("Undone");
  };

  // ---- frame and probability helpers
  ExamPage.prototype.prob = function (label, row) {
    return this.probs ? this.probs[label * this.T + row] / 255 : null;
  };

  ExamPage.prototype.eventStats = function (ev) {
    if (!this.probs || ev.e < ev.s) return null;
    var self = this;
    return ev.label.map(function (n) {
      var k = self.labelIndex[n], base = k * self.T, sum = 0, mx = 0;
      for (var r = ev.s; r <= ev.e; r++) { var v = self.probs[base + r]; sum += v; if (v > mx) mx = v; }
      return { label: n, mean: sum / (ev.e - ev.s + 1) / 255, max: mx / 255 };
    });
  };

  ExamPage.prototype.seconds = function (s, e) {
    if (!this.d.frame_rate) return null;
    return (this.frameNumber[e] - this.frameNumber[s] + 1) / this.d.frame_rate;
  };

  ExamPage.prototype.frameUrl = function (row) {
    var f = this.d.frames;
    if (f.kind === "stored") {
      var r = nearest(this.storedRows, row);
      return { url: f.dir + "/" + r + ".jpg", row: r };
    }
    if (f.urls) return { url: f.urls[row], row: row };
    var num = String(this.frameNumber[row]).padStart(f.width, "0");
    return { url: f.base + "/" + encodeURIComponent(f.prefix + num + f.suffix), row: row };
  };

  ExamPage.prototype.fileName = function (row) {
    var f = this.d.frames;
    if (f.kind === "stored") return this.d.source + ", decoded frame " + fmt(this.frameNumber[row]);
    if (f.urls) return decodeURIComponent(f.urls[row].split("/").pop());
    return f.prefix + String(this.frameNumber[row]).padStart(f.width, "0") + f.suffix;
  };

  ExamPage.prototype.thumbUrl = function (row) {
    var r = nearest(this.thumbRows, row);
    return { url: this.d.thumbs.dir + "/" + r + ".jpg", row: r };
  };

  // ---- events and filters
  ExamPage.prototype.isPathology = function (ev) {
    var self = this;
    return ev.label.some(function (n) { return self.d.pathology.indexOf(n) >= 0; });
  };

  ExamPage.prototype.visibleEvents = function () {
    var self = this, out = [];
    this.state.events.forEach(function (ev, i) {
      var f = self.filter;
      if (f === "pathology" && !self.isPathology(ev)) return;
      if (f === "anatomy" && self.isPathology(ev)) return;
      if (f === "pending" && ev.status !== "pending") return;
      out.push(i);
    });
    return out;
  };

  ExamPage.prototype.select = function (i, goToFrame) {
    if (i < 0 || i >= this.state.events.length) return;
    this.sel = i;
    var ev = this.state.events[i];
    if (goToFrame) {
      var th = ev.added || ev.edited ? null : this.thumbsByEvent[ev.k];
      this.setFrame(th ? th.peak : Math.max(0, Math.min(this.T - 1, ev.s)), true);
      this.ensureVisible(ev);
    }
    this.renderList(false);
    this.renderViewerEvent();
    this.dirty = true;
    this.draw();
  };

  ExamPage.prototype.step = function (delta) {
    var vis = this.visibleEvents();
    if (!vis.length) return;
    var pos = vis.indexOf(this.sel);
    var next = pos < 0 ? (delta > 0 ? 0 : vis.length - 1) : Math.max(0, Math.min(vis.length - 1, pos + delta));
    this.select(vis[next], true);
  };

  ExamPage.prototype.setStatus = function (status) {
    if (this.sel < 0) { this.flash("Select an event first"); return; }
    var ev = this.state.events[this.sel];
    this.pushUndo();
    ev.status = ev.status === status ? "pending" : status;
    this.changed(true);
    if (this.state.autoAdvance && ev.status !== "pending") {
      var vis = this.visibleEvents(), pos = vis.indexOf(this.sel);
      for (var j = pos + 1; j < vis.length; j++) {
        if (this.state.events[vis[j]].status === "pending") { this.select(vis[j], true); return; }
      }
    }
  };

  ExamPage.prototype.setBoundary = function (which, row) {
    if (this.sel < 0) { this.flash("Select an event first"); return; }
    var ev = this.state.events[this.sel];
    row = Math.max(0, Math.min(this.T - 1, row));
    if (which === "start" && row > ev.e) { this.flash("The start cannot be after the end (" + this.unitName + " " + fmt(ev.end) + ")"); return; }
    if (which === "end" && row < ev.s) { this.flash("The end cannot be before the start (" + this.unitName + " " + fmt(ev.start) + ")"); return; }
    this.pushUndo();
    if (which === "start") { ev.s = row; ev.start = this.ids[row]; } else { ev.e = row; ev.end = this.ids[row]; }
    ev.edited = true;
    this.changed(true);
  };

  ExamPage.prototype.addEvent = function () {
    var label = this.labelSelect.value;
    this.pushUndo();
    var r = this.frame;
    var ev = { k: this.state.nextKey++, label: [label], start: this.ids[r], end: this.ids[r], s: r, e: r,
               status: "accepted", added: true, edited: true };
    this.state.events.push(ev);
    this.state.newLabel = label;
    if (this.filter !== "all") { this.filter = "all"; this.filterSelect.value = "all"; }
    this.changed(true);
    this.select(this.state.events.length - 1, false);
    this.flash("Added a " + label + " event at " + this.unitName + " " + fmt(ev.start) + "; set its end with ]");
  };

  ExamPage.prototype.deleteEvent = function () {
    if (this.sel < 0) return;
    var ev = this.state.events[this.sel];
    if (!ev.added) { if (ev.status !== "rejected") this.setStatus("rejected"); return; }
    this.pushUndo();
    this.state.events.splice(this.sel, 1);
    this.sel = Math.min(this.sel, this.state.events.length - 1);
    this.changed(true);
  };

  ExamPage.prototype.changed = function (saveIt) {
    if (saveIt) this.save();
    this.dirty = true;
    this.renderList(true);
    this.renderCounts();
    this.renderViewerEvent();
    this.draw();
  };

  // ---- export
  ExamPage.prototype.exportJSON = function () {
    var out = { videos: [{ video_id: this.d.video_id,
      events: exportedEvents(this.state.events, this.state.includePending) }] };
    return JSON.stringify(out, null, 2) + "\n";
  };

  ExamPage.prototype.exportCSV = function () {
    var T = this.T, L = this.L, self = this;
    var on = new Uint8Array(T * L);
    this.state.events.forEach(function (ev) {
      if (ev.status === "rejected") return;
      if (!(ev.added || ev.status === "accepted" || self.state.includePending)) return;
      var s = Math.max(0, ev.s), e = Math.min(T - 1, ev.e);
      ev.label.forEach(function (n) {
        var k = self.labelIndex[n];
        for (var r = s; r <= e; r++) on[r * L + k] = 1;
      });
    });
    var lines = new Array(T + 1);
    lines[0] = ["index"].concat(this.labels).concat(["frame"]).join(",");
    var row = new Array(L + 2);
    for (var r = 0; r < T; r++) {
      row[0] = this.frameIndex[r];
      for (var k = 0; k < L; k++) row[k + 1] = on[r * L + k];
      row[L + 1] = this.frameNumber[r];
      lines[r + 1] = row.join(",");
    }
    return lines.join("\n") + "\n";
  };

  // ------------------------------------------------------------------------------------- page building
  ExamPage.prototype.build = function () {
    var self = this, d = this.d;
    document.title = "VCE review: " + d.video_id;
    var counts = el("span", { className: "counts", id: "review-counts" });
    this.countsEl = counts;
    var include = el("input", { type: "checkbox", id: "include-pending" });
    include.checked = !!this.state.includePending;
    include.addEventListener("change", function () { self.state.includePending = include.checked; self.save(); });
    var meta = [fmt(this.T) + " frames"];
    if (d.frame_rate) meta.push(fmtDuration(d.duration_seconds) + " at " + (+d.frame_rate.toFixed(2)) + " frames/s");
    meta.push("frames shown in " + this.unitName + " units");
    if (d.source) meta.push("video file " + d.source);
    var header = el("header", { className: "topbar" }, [
      el("a", { href: "../index.html", className: "back", text: "← All exams" }),
      el("h1", { id: "exam-title", text: d.video_id }),
      el("span", { className: "muted", text: meta.join(" · ") }),
      el("span", { className: "spacer" }),
      counts,
      el("button", { className: "button", id: "undo", text: "Undo", title: "Undo (Ctrl+Z)", onclick: function () { self.undo(); } }),
      el("label", { className: "check", title: "Unreviewed events are exported as predicted; rejected events never" },
        [include, " export unreviewed"]),
      el("button", { className: "button primary", id: "export-json", text: "Export JSON",
        title: "Reviewed events as challenge event JSON",
        onclick: function () { download(safeFileName(d.video_id) + "_reviewed.json", self.exportJSON(), "application/json"); } }),
      el("button", { className: "button primary", id: "export-csv", text: "Export labels CSV",
        title: "Galar-format labels of every frame (index, 17 labels, frame); save as <video_id>.csv in the labels folder",
        onclick: function () { download(safeFileName(d.video_id) + ".csv", self.exportCSV(), "text/csv"); } }),
      el("button", { className: "button", id: "help-button", text: "Keys (?)", onclick: function () { self.toggleHelp(); } })
    ]);

    // timeline
    this.canvas = el("canvas", { id: "timeline", tabindex: "-1" });
    this.canvasWrap = el("div", { className: "timeline-wrap" }, [this.canvas]);
    this.strip = el("div", { className: "strip", id: "strip" });
    var zoomButtons = el("div", { className: "timeline-tools" }, [
      el("span", { className: "muted small", text: "Timeline: wheel or + / − to zoom, drag to pan, click to show a frame" }),
      el("span", { className: "spacer" }),
      el("button", { className: "button small", text: "−", title: "Zoom out (−)", onclick: function () { self.zoom(1.6); } }),
      el("button", { className: "button small", text: "+", title: "Zoom in (+)", onclick: function () { self.zoom(1 / 1.6); } }),
      el("button", { className: "button small", text: "Event", title: "Zoom to the selected event (E)", onclick: function () { self.zoomToEvent(); } }),
      el("button", { className: "button small", text: "Whole exam", title: "Show the whole exam (F)", onclick: function () { self.fitView(); } })
    ]);
    var timeline = el("section", { className: "timeline-panel" }, [zoomButtons, this.canvasWrap, this.strip]);

    // event list
    this.filterSelect = el("select", { id: "event-filter", title: "Which events to list (and step through)" }, [
      el("option", { value: "all", text: "All events" }), el("option", { value: "pathology", text: "Pathology events" }),
      el("option", { value: "anatomy", text: "Anatomy events" }), el("option", { value: "pending", text: "Not reviewed yet" })
    ]);
    this.filterSelect.addEventListener("change", function () {
      self.filter = self.filterSelect.value; self.renderList(true);
      var vis = self.visibleEvents();
      if (vis.length && vis.indexOf(self.sel) < 0) self.select(vis[0], true);
    });
    this.list = el("div", { className: "event-list", id: "event-list" });
    var listPanel = el("section", { className: "list-panel" }, [
      el("div", { className: "panel-head" }, [el("h2", { text: "Events" }),
        el("span", { className: "muted small", text: "most confident first" }), el("span", { className: "spacer" }), this.filterSelect]),
      this.list
    ]);

    // frame viewer
    this.img = el("img", { id: "frame-image", alt: "frame" });
    this.img.addEventListener("error", function () { self.viewerNote.textContent = "Frame image not found: " + self.img.getAttribute("src"); });
    this.frameTitle = el("div", { className: "frame-title", id: "frame-title" });
    this.frameSub = el("div", { className: "frame-sub muted", id: "frame-sub" });
    this.viewerNote = el("div", { className: "viewer-note", id: "viewer-note" });
    this.frameLabels = el("div", { className: "chips", id: "frame-labels" });
    this.frameProbs = el("div", { className: "frame-probs", id: "frame-probs" });
    this.eventBox = el("div", { className: "event-box", id: "event-box" });
    this.labelSelect = el("select", { id: "new-label", title: "Label of a new event" },
      this.labels.map(function (n) { return el("option", { value: n, text: n }); }));
    this.labelSelect.value = this.state.newLabel || d.pathology[0];
    var b = function (text, title, fn, id) { return el("button", { className: "button", text: text, title: title, onclick: fn, id: id }); };
    var controls = el("div", { className: "viewer-controls" }, [
      el("div", { className: "control-row" }, [
        b("◀◀", "10 frames back (Shift+←)", function () { self.setFrame(self.frame - 10); }),
        b("◀", "Previous frame (←)", function () { self.setFrame(self.frame - 1); }, "prev-frame"),
        b("▶", "Next frame (→)", function () { self.setFrame(self.frame + 1); }, "next-frame"),
        b("▶▶", "10 frames on (Shift+→)", function () { self.setFrame(self.frame + 10); }),
        el("span", { className: "spacer" }),
        b("Start here [", "Move the selected event's start to this frame ([)", function () { self.setBoundary("start", self.frame); }, "set-start"),
        b("End here ]", "Move the selected event's end to this frame (])", function () { self.setBoundary("end", self.frame); }, "set-end")
      ]),
      el("div", { className: "control-row" }, [
        el("button", { className: "button accept", id: "accept", text: "✓ Accept (A)", onclick: function () { self.setStatus("accepted"); } }),
        el("button", { className: "button reject", id: "reject", text: "✕ Reject (R)", onclick: function () { self.setStatus("rejected"); } }),
        el("span", { className: "spacer" }),
        el("label", { className: "small", text: "New event: " }), this.labelSelect,
        b("+ Add (N)", "Add an event of this label at the shown frame (N)", function () { self.addEvent(); }, "add-event")
      ])
    ]);
    var viewer = el("section", { className: "viewer-panel" }, [
      el("div", { className: "viewer-head" }, [this.frameTitle, this.frameSub]),
      el("div", { className: "viewer-body" }, [
        el("div", { className: "viewer-img" }, [this.img, this.viewerNote]),
        el("div", { className: "viewer-side" }, [this.eventBox, el("h3", { text: "Events at this frame" }), this.frameLabels,
          el("h3", { text: this.probs ? "Probabilities at this frame" : "" }), this.frameProbs])
      ]),
      controls
    ]);
    this.flashEl = el("div", { className: "flash", id: "flash", role: "status" });
    this.help = this.buildHelp();
    document.body.appendChild(header);
    document.body.appendChild(el("main", { className: "exam-main" }, [timeline,
      el("div", { className: "lower" }, [listPanel, viewer])]));
    document.body.appendChild(this.flashEl);
    document.body.appendChild(this.help);
    this.bindTimeline();
    this.bindKeys();
    window.addEventListener("resize", function () { self.dirty = true; self.draw(); });
    this.list.addEventListener("scroll", function () {
      if (self.list.scrollTop + self.list.clientHeight > self.list.scrollHeight - 400) self.renderMoreCards();
    });
    this.cssWidth = Math.max(300, this.canvasWrap.clientWidth);
    this.renderList(true);
    this.renderCounts();
  };

  ExamPage.prototype.buildHelp = function () {
    var self = this;
    var keys = [
      ["↓ or J", "next event"], ["↑ or K", "previous event"], ["→ / ←", "next / previous frame"],
      ["Shift + → / ←", "10 frames on / back"], ["Page Down / Up", "100 frames on / back"],
      ["Home / End", "first / last frame of the event"], ["P", "most probable frame of the event"],
      ["A", "accept the event (again: undo the mark)"], ["R or X", "reject the event (again: undo the mark)"],
      ["U", "mark the event as not reviewed"], ["[ / ]", "move the event's start / end to the shown frame"],
      ["N", "add an event of the chosen label at the shown frame"], ["Delete", "delete an added event (reject a predicted one)"],
      ["+ / −", "zoom the timeline in / out"], ["E", "zoom to the event"], ["F", "show the whole exam"],
      ["Ctrl + Z", "undo"], ["?", "this help"], ["Esc", "close this help"]
    ];
    var rows = keys.map(function (k) { return el("tr", null, [el("td", null, [el("kbd", { text: k[0] })]), el("td", { text: k[1] })]); });
    var auto = el("input", { type: "checkbox", id: "auto-advance" });
    auto.checked = !!this.state.autoAdvance;
    auto.addEventListener("change", function () { self.state.autoAdvance = auto.checked; self.save(); });
    var box = el("div", { className: "help-box" }, [
      el("h2", { text: "Keyboard" }), el("table", null, rows),
      el("label", { className: "check" }, [auto, " after accept or reject, go to the next event not reviewed yet"]),
      el("p", { className: "muted small", text: "Frames are shown in " + this.unitName + " units, the units of the event file. " +
        "Review marks are saved in this browser as you work. Export JSON: the reviewed events in the challenge format. " +
        "Export labels CSV: one row per frame in the Galar label format (index, 17 labels, frame); put it in the labels folder " +
        "as <video_id>.csv to train on the corrections." }),
      el("button", { className: "button", text: "Close", onclick: function () { self.toggleHelp(false); } })
    ]);
    return el("div", { className: "help hidden", id: "help" }, [box]);
  };

  ExamPage.prototype.toggleHelp = function (show) {
    var hidden = this.help.classList.contains("hidden");
    if (show === undefined) show = hidden;
    this.help.classList.toggle("hidden", !show);
  };

  ExamPage.prototype.flash = function (text) {
    var f = this.flashEl;
    f.textContent = text;
    f.classList.add("show");
    clearTimeout(this.flashTimer);
    this.flashTimer = setTimeout(function () { f.classList.remove("show"); }, 2600);
  };

  ExamPage.prototype.renderCounts = function () {
    var c = reviewCounts(this.state.events);
    this.countsEl.textContent = "";
    this.countsEl.appendChild(el("b", { text: "Reviewed " + c.reviewed + " / " + c.total }));
    this.countsEl.appendChild(el("span", { className: "c-acc", text: " ✓ " + c.accepted }));
    this.countsEl.appendChild(el("span", { className: "c-rej", text: " ✕ " + c.rejected }));
    if (c.added) this.countsEl.appendChild(el("span", { className: "c-add", text: " + " + c.added + " added" }));
  };

  // ---- event list
  ExamPage.prototype.renderList = function (rebuild) {
    var self = this;
    if (rebuild) {
      this.list.textContent = "";
      this.cards = {};
      this.renderedCards = 0;
      this.visible = this.visibleEvents();
      if (!this.visible.length) this.list.appendChild(el("p", { className: "muted empty", text: "No event in this list." }));
      this.renderMoreCards();
    }
    var pos = this.visible.indexOf(this.sel);
    while (pos >= this.renderedCards) this.renderMoreCards();
    Object.keys(this.cards).forEach(function (i) {
      self.cards[i].classList.toggle("selected", Number(i) === self.sel);
    });
    var card = this.cards[this.sel];
    if (card) {
      var top = card.offsetTop, bottom = top + card.offsetHeight;  // the list is the cards' offset parent
      if (top < this.list.scrollTop) this.list.scrollTop = top - 4;
      else if (bottom > this.list.scrollTop + this.list.clientHeight) this.list.scrollTop = bottom - this.list.clientHeight + 4;
    }
  };

  ExamPage.prototype.renderMoreCards = function () {
    var end = Math.min(this.visible.length, this.renderedCards + 60);
    for (var p = this.renderedCards; p < end; p++) {
      var i = this.visible[p];
      var card = this.card(i, p);
      this.cards[i] = card;
      this.list.appendChild(card);
    }
    this.renderedCards = end;
  };

  ExamPage.prototype.chip = function (n) {
    return el("span", { className: "chip " + (this.d.pathology.indexOf(n) >= 0 ? "chip-path" : "chip-anat"), text: n });
  };

  ExamPage.prototype.rangeText = function (ev) {
    var n = ev.e - ev.s + 1;
    var t = this.unitName.charAt(0).toUpperCase() + this.unitName.slice(1) + " " + fmt(ev.start) + " – " + fmt(ev.end) +
      " · " + fmt(Math.max(0, n)) + (n === 1 ? " frame" : " frames");
    var sec = ev.e >= ev.s ? this.seconds(ev.s, ev.e) : null;
    if (sec !== null) t += " · " + fmtDuration(sec);
    return t;
  };

  ExamPage.prototype.card = function (i, pos) {
    var self = this, ev = this.state.events[i];
    var status = ev.status === "accepted" ? "accepted" : ev.status === "rejected" ? "rejected" : "not reviewed";
    var head = el("div", { className: "ev-head" }, [
      el("span", { className: "ev-rank", text: ev.added ? "new" : "#" + (ev.k + 1) })
    ].concat(ev.label.map(function (n) { return self.chip(n); })).concat([
      el("span", { className: "spacer" }),
      ev.score !== null && ev.score !== undefined ?
        el("span", { className: "badge score", text: "score " + ev.score.toFixed(2),
                     title: "screening score: logit margin over the label's operating threshold" }) : null,
      ev.edited && !ev.added ? el("span", { className: "badge edited", text: "edited" }) : null,
      el("span", { className: "badge " + ev.status, text: status })
    ]));
    var stats = this.eventStats(ev);
    var probs = stats ? el("div", { className: "ev-probs" }, stats.map(function (s) {
      return el("span", null, [el("b", { text: s.label }), " mean " + s.mean.toFixed(2) + " · max " + s.max.toFixed(2)]);
    })) : null;
    var thumbs = el("div", { className: "ev-thumbs" });
    var th = this.thumbsByEvent[ev.k];
    var rows;
    if (th && !ev.added && !ev.edited) rows = th.rows;
    else {
      rows = [];
      var n = Math.min(7, Math.max(1, ev.e - ev.s + 1));
      for (var q = 0; q < n; q++) rows.push(Math.round(ev.s + (ev.e - ev.s) * (n === 1 ? 0 : q / (n - 1))));
    }
    var peak = th && !ev.added && !ev.edited ? th.peak : -1;
    rows.forEach(function (r) {
      var t = self.thumbUrl(r);
      var cap = r === ev.s ? "start" : r === ev.e ? "end" : r === peak ? "peak" : fmt(self.ids[r]);
      var fig = el("figure", { className: "thumb" + (r === peak ? " peak" : ""), title: self.unitName + " " + fmt(self.ids[r]) +
        (t.row !== r ? " (nearest thumbnail: " + fmt(self.ids[t.row]) + ")" : "") }, [
        el("img", { src: t.url, alt: "", loading: "lazy" }), el("figcaption", { text: cap })
      ]);
      fig.addEventListener("click", function (e) { e.stopPropagation(); self.select(i, false); self.setFrame(r, true); });
      thumbs.appendChild(fig);
    });
    var actions = el("div", { className: "ev-actions" }, [
      el("button", { className: "button small accept", text: "✓ Accept", onclick: function (e) { e.stopPropagation(); self.select(i, false); self.setStatus("accepted"); } }),
      el("button", { className: "button small reject", text: "✕ Reject", onclick: function (e) { e.stopPropagation(); self.select(i, false); self.setStatus("rejected"); } })
    ]);
    var card = el("div", { className: "event-card " + ev.status, dataset: { event: String(i), pos: String(pos) } }, [
      head, el("div", { className: "ev-meta", text: this.rangeText(ev) }), probs, thumbs, actions
    ]);
    card.addEventListener("click", function () { self.select(i, true); });
    return card;
  };

  // ---- frame viewer
  ExamPage.prototype.setFrame = function (row, keepView) {
    if (!this.T) return;
    row = Math.max(0, Math.min(this.T - 1, Math.round(row)));
    this.frame = row;
    var u = this.frameUrl(row);
    if (this.img.getAttribute("src") !== u.url) { this.viewerNote.textContent = ""; this.img.setAttribute("src", u.url); }
    this.viewerNote.textContent = u.row !== row ? "Video exam: nearest stored frame shown (" + this.unitName + " " +
      fmt(this.ids[u.row]) + "); full-size frames are stored around the events." : "";
    var id = this.ids[row];
    this.frameTitle.textContent = (this.unitName.charAt(0).toUpperCase() + this.unitName.slice(1)) + " " + fmt(id);
    var sub = ["frame " + fmt(row + 1) + " of " + fmt(this.T)];
    if (this.d.units === "frame_index") sub.push("frame number " + fmt(this.frameNumber[row]));
    else sub.push("frame index " + fmt(this.frameIndex[row]));
    sub.push(this.fileName(row));
    if (this.d.frame_rate) sub.push(clock(this.frameNumber[row] / this.d.frame_rate));
    this.frameSub.textContent = sub.join(" · ");
    this.renderFrameInfo();
    // preload the neighbours for smooth stepping
    [row - 1, row + 1, row + 2].forEach(function (r) {
      if (r >= 0 && r < this.T) { var im = new Image(); im.src = this.frameUrl(r).url; }
    }, this);
    if (!keepView) this.ensureRowVisible(row);
    this.draw();
  };

  ExamPage.prototype.renderFrameInfo = function () {
    var self = this, row = this.frame;
    this.frameLabels.textContent = "";
    var here = this.state.events.filter(function (ev) { return ev.s <= row && row <= ev.e && ev.status !== "rejected"; });
    var names = {};
    here.forEach(function (ev) { ev.label.forEach(function (n) { names[n] = true; }); });
    var shown = this.labels.filter(function (n) { return names[n]; });
    if (!shown.length) this.frameLabels.appendChild(el("span", { className: "muted small", text: "none" }));
    shown.forEach(function (n) { self.frameLabels.appendChild(self.chip(n)); });
    this.frameProbs.textContent = "";
    if (!this.probs) return;
    var items = this.labels.map(function (n, k) { return { n: n, p: self.prob(k, row) }; });
    items.forEach(function (it) {
      var pathology = self.d.pathology.indexOf(it.n) >= 0;
      self.frameProbs.appendChild(el("div", { className: "pbar-row" + (it.p >= 0.5 ? " high" : "") }, [
        el("span", { className: "pbar-name", text: it.n }),
        el("span", { className: "pbar" }, [el("span", { className: "pbar-fill" + (pathology ? " path" : ""),
          style: "width:" + (100 * it.p).toFixed(1) + "%" })]),
        el("span", { className: "pbar-val", text: it.p.toFixed(2) })
      ]));
    });
  };

  ExamPage.prototype.renderViewerEvent = function () {
    var self = this;
    this.eventBox.textContent = "";
    if (this.sel < 0) { this.eventBox.appendChild(el("p", { className: "muted", text: "No event selected" })); return; }
    var ev = this.state.events[this.sel];
    this.eventBox.appendChild(el("div", { className: "ev-head" }, [
      el("span", { className: "ev-rank", text: ev.added ? "new event" : "Event #" + (ev.k + 1) })
    ].concat(ev.label.map(function (n) { return self.chip(n); })).concat([el("span", { className: "spacer" }),
      el("span", { className: "badge " + ev.status, text: ev.status === "pending" ? "not reviewed" : ev.status })])));
    this.eventBox.appendChild(el("div", { className: "ev-meta", text: this.rangeText(ev) }));
    var nudge = function (text, which, d) {
      return el("button", { className: "button tiny", text: text, title: "Move the " + which + " by " + d + " frame",
        onclick: function () { self.setBoundary(which, (which === "start" ? ev.s : ev.e) + d); } });
    };
    this.eventBox.appendChild(el("div", { className: "nudges" }, [
      el("span", { className: "small muted", text: "start " }), nudge("−1", "start", -1), nudge("+1", "start", 1),
      el("span", { className: "small muted", text: "  end " }), nudge("−1", "end", -1), nudge("+1", "end", 1),
      el("button", { className: "button tiny", text: "go to start", onclick: function () { self.setFrame(ev.s); } }),
      el("button", { className: "button tiny", text: "go to end", onclick: function () { self.setFrame(ev.e); } })
    ]));
  };

  // ---- keyboard
  ExamPage.prototype.bindKeys = function () {
    var self = this;
    document.addEventListener("keydown", function (e) {
      var tag = (e.target && e.target.tagName) || "";
      if (e.key === "Escape") { self.toggleHelp(false); if (tag === "SELECT" || tag === "INPUT") e.target.blur(); return; }
      if (tag === "INPUT" || tag === "SELECT" || tag === "TEXTAREA") return;
      if ((e.ctrlKey || e.metaKey) && (e.key === "z" || e.key === "Z")) { e.preventDefault(); self.undo(); return; }
      if (e.ctrlKey || e.metaKey || e.altKey) return;
      var ev = self.sel >= 0 ? self.state.events[self.sel] : null;
      var handled = true;
      switch (e.key) {
        case "ArrowDown": case "j": case "J": self.step(1); break;
        case "ArrowUp": case "k": case "K": self.step(-1); break;
        case "ArrowRight": self.setFrame(self.frame + (e.shiftKey ? 10 : 1)); break;
        case "ArrowLeft": self.setFrame(self.frame - (e.shiftKey ? 10 : 1)); break;
        case "PageDown": self.setFrame(self.frame + 100); break;
        case "PageUp": self.setFrame(self.frame - 100); break;
        case "Home": if (ev) self.setFrame(ev.s); break;
        case "End": if (ev) self.setFrame(ev.e); break;
        case "p": case "P":
          if (ev) { var th = self.thumbsByEvent[ev.k]; self.setFrame(th && !ev.added && !ev.edited ? th.peak : self.peakOf(ev)); }
          break;
        case "a": case "A": self.setStatus("accepted"); break;
        case "r": case "R": case "x": case "X": self.setStatus("rejected"); break;
        case "u": case "U": if (ev && ev.status !== "pending") { self.pushUndo(); ev.status = "pending"; self.changed(true); } break;
        case "[": self.setBoundary("start", self.frame); break;
        case "]": self.setBoundary("end", self.frame); break;
        case "n": case "N": self.addEvent(); break;
        case "Delete": case "Backspace": self.deleteEvent(); break;
        case "+": case "=": self.zoom(1 / 1.6); break;
        case "-": case "_": self.zoom(1.6); break;
        case "e": case "E": self.zoomToEvent(); break;
        case "f": case "F": self.fitView(); break;
        case "?": self.toggleHelp(); break;
        default: handled = false;
      }
      if (handled) e.preventDefault();
    });
  };

  ExamPage.prototype.peakOf = function (ev) {
    if (!this.probs || ev.e < ev.s) return ev.s;
    var best = ev.s, bv = -1, self = this;
    ev.label.forEach(function (n) {
      var base = self.labelIndex[n] * self.T;
      for (var r = ev.s; r <= ev.e; r++) if (self.probs[base + r] > bv) { bv = self.probs[base + r]; best = r; }
    });
    return best;
  };

  // ------------------------------------------------------------------------------------------ timeline
  var LANE_H = 17, LABEL_W = 150, MINI_H = 14, BAND_H = 14, AXIS_H = 20, GAP = 6;

  ExamPage.prototype.layout = function () {
    var y = 2, L = {};
    L.mini = y; y += MINI_H + GAP;
    L.band = y; y += BAND_H + 2;
    if (this.gt) { L.gtBand = y; y += BAND_H + 2; }
    y += 4;
    L.lanes = y; y += LANE_H * this.L;
    L.axis = y; y += AXIS_H;
    L.height = y;
    return L;
  };

  ExamPage.prototype.plotWidth = function () { return Math.max(50, this.cssWidth - LABEL_W - 8); };

  ExamPage.prototype.x = function (row) {
    return LABEL_W + (row - this.view.r0) / (this.view.r1 - this.view.r0) * this.plotWidth();
  };

  ExamPage.prototype.rowAt = function (x) {
    return this.view.r0 + (x - LABEL_W) / this.plotWidth() * (this.view.r1 - this.view.r0);
  };

  ExamPage.prototype.minSpan = function () { return Math.min(this.T, Math.max(6, this.plotWidth() / 40)); };

  ExamPage.prototype.setView = function (r0, r1) {
    var span = Math.max(this.minSpan(), Math.min(this.T, r1 - r0));
    if (r0 < 0) r0 = 0;
    if (r0 + span > this.T) r0 = this.T - span;
    this.view = { r0: Math.max(0, r0), r1: Math.max(0, r0) + span };
    this.dirty = true;
    this.draw();
    this.renderStrip();
  };

  ExamPage.prototype.fitView = function () { this.setView(0, this.T); };

  ExamPage.prototype.zoom = function (factor, centerRow) {
    var c = centerRow === undefined ? this.frame + 0.5 : centerRow;
    var r0 = this.view.r0, r1 = this.view.r1;
    var f = (c - r0) / (r1 - r0);
    var span = Math.max(this.minSpan(), Math.min(this.T, (r1 - r0) * factor));
    this.setView(c - f * span, c - f * span + span);
  };

  ExamPage.prototype.zoomToEvent = function () {
    if (this.sel < 0) return;
    var ev = this.state.events[this.sel], n = ev.e - ev.s + 1, pad = Math.max(5, n * 0.6);
    this.setView(ev.s - pad, ev.e + 1 + pad);
  };

  ExamPage.prototype.ensureVisible = function (ev) {
    var span = this.view.r1 - this.view.r0;
    if (ev.s >= this.view.r0 && ev.e + 1 <= this.view.r1) return;
    if (ev.e - ev.s + 1 > span * 0.8) { this.zoomToEvent(); return; }
    var c = (ev.s + ev.e + 1) / 2;
    this.setView(c - span / 2, c + span / 2);
  };

  ExamPage.prototype.ensureRowVisible = function (row) {
    if (row >= this.view.r0 && row + 1 <= this.view.r1) return;
    var span = this.view.r1 - this.view.r0;
    this.setView(row + 0.5 - span / 2, row + 0.5 + span / 2);
  };

  ExamPage.prototype.sectionRuns = function (events) {
    // [row start, row end, section] of the section labels of non-rejected events
    var self = this, runs = [];
    events.forEach(function (ev) {
      if (ev.status === "rejected") return;
      ev.label.forEach(function (n) { if (self.d.sections.indexOf(n) >= 0) runs.push([ev.s, ev.e, n]); });
    });
    // one run per stretch of a section (label-set events split a section around its pathology events)
    runs.sort(function (a, b) { return a[0] - b[0]; });
    var merged = [];
    runs.forEach(function (r) {
      var m = merged[merged.length - 1];
      if (m && m[2] === r[2] && r[0] <= m[1] + 1) m[1] = Math.max(m[1], r[1]);
      else merged.push(r.slice());
    });
    return merged;
  };

  ExamPage.prototype.draw = function () {
    var self = this;
    if (this.drawPending) return;
    this.drawPending = true;
    var run = function () { self.drawPending = false; self.drawNow(); };
    if (window.requestAnimationFrame && document.visibilityState !== "hidden") window.requestAnimationFrame(run);
    else setTimeout(run, 0);
  };

  ExamPage.prototype.drawNow = function () {
    var L = this.layout(), c = this.canvas;
    var w = Math.max(300, this.canvasWrap.clientWidth);
    var dpr = window.devicePixelRatio || 1;
    if (this.cssWidth !== w || c.width !== Math.round(w * dpr) || c.height !== Math.round(L.height * dpr)) {
      this.cssWidth = w;
      c.width = Math.round(w * dpr); c.height = Math.round(L.height * dpr);
      c.style.width = w + "px"; c.style.height = L.height + "px";
      this.dirty = true;
      if (!this.strip.childNodes.length) this.renderStrip();
    }
    if (this.dirty || !this.base) { this.drawBase(L, dpr); this.dirty = false; }
    var g = c.getContext("2d");
    g.setTransform(1, 0, 0, 1, 0, 0);
    g.clearRect(0, 0, c.width, c.height);
    g.drawImage(this.base, 0, 0);
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    // the shown frame
    var x0 = this.x(this.frame), x1 = this.x(this.frame + 1);
    if (x1 >= LABEL_W && x0 <= LABEL_W + this.plotWidth()) {
      g.fillStyle = "rgba(214, 39, 40, 0.18)";
      g.fillRect(Math.max(LABEL_W, x0), L.band, Math.max(1.5, x1 - x0), L.axis - L.band);
      g.strokeStyle = "#d62728"; g.lineWidth = 1.5;
      g.beginPath(); g.moveTo((x0 + x1) / 2, L.band); g.lineTo((x0 + x1) / 2, L.axis); g.stroke();
    }
    // position of the shown frame on the overview bar
    var mx = LABEL_W + (this.frame + 0.5) / this.T * this.plotWidth();
    g.fillStyle = "#d62728"; g.fillRect(mx - 1, L.mini, 2, MINI_H);
  };

  ExamPage.prototype.drawBase = function (L, dpr) {
    var self = this;
    if (!this.base) this.base = document.createElement("canvas");
    var b = this.base;
    b.width = this.canvas.width; b.height = this.canvas.height;
    var g = b.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    var W = this.cssWidth, PW = this.plotWidth(), r0 = this.view.r0, r1 = this.view.r1;
    g.fillStyle = "#ffffff"; g.fillRect(0, 0, W, L.height);
    g.font = "12px system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif";
    g.textBaseline = "middle";

    // overview of the whole exam: sections and the shown window
    var runsAll = this.sectionRuns(this.state.events);
    g.fillStyle = "#eceff3"; g.fillRect(LABEL_W, L.mini, PW, MINI_H);
    runsAll.forEach(function (r) {
      g.fillStyle = self.d.section_colors[r[2]];
      var a = LABEL_W + r[0] / self.T * PW, z = LABEL_W + (r[1] + 1) / self.T * PW;
      g.fillRect(a, L.mini + 3, Math.max(1, z - a), MINI_H - 6);
    });
    var wa = LABEL_W + r0 / this.T * PW, wz = LABEL_W + r1 / this.T * PW;
    g.strokeStyle = "#1d2733"; g.lineWidth = 1.5;
    g.strokeRect(wa, L.mini + 0.5, Math.max(3, wz - wa), MINI_H - 1);
    g.fillStyle = "#444"; g.textAlign = "right";
    g.fillText("whole exam", LABEL_W - 8, L.mini + MINI_H / 2);

    // section bands
    var band = function (y, runs, title) {
      g.fillStyle = "#f3f4f6"; g.fillRect(LABEL_W, y, PW, BAND_H);
      runs.forEach(function (r) {
        if (r[1] + 1 < r0 || r[0] > r1) return;
        var a = Math.max(LABEL_W, self.x(r[0])), z = Math.min(LABEL_W + PW, self.x(r[1] + 1));
        g.fillStyle = self.d.section_colors[r[2]];
        g.fillRect(a, y, Math.max(1, z - a), BAND_H);
        if (z - a > 90) {
          g.fillStyle = "#ffffff"; g.textAlign = "left"; g.font = "bold 11px system-ui, sans-serif";
          g.fillText(r[2], a + 5, y + BAND_H / 2 + 0.5);
          g.font = "12px system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif";
        }
      });
      g.fillStyle = "#333"; g.textAlign = "right";
      g.fillText(title, LABEL_W - 8, y + BAND_H / 2);
    };
    band(L.band, runsAll, "sections");
    if (this.gt) band(L.gtBand, this.sectionRuns(this.gt.map(function (e) { return { s: e.s, e: e.e, label: e.label, status: "pending" }; })), "sections (truth)");

    // lanes
    var nAnat = this.d.anatomy.length;
    for (var k = 0; k < this.L; k++) {
      var y = L.lanes + k * LANE_H;
      g.fillStyle = k % 2 ? "#fbfbfc" : "#f4f5f7";
      g.fillRect(LABEL_W, y, PW, LANE_H);
      g.fillStyle = k >= nAnat ? "#8a1f1f" : "#1d2733";
      g.textAlign = "right";
      g.fillText(this.labels[k], LABEL_W - 8, y + LANE_H / 2);
    }
    g.strokeStyle = "#9aa3ad"; g.lineWidth = 1;
    g.beginPath(); g.moveTo(6, L.lanes + nAnat * LANE_H + 0.5); g.lineTo(LABEL_W + PW, L.lanes + nAnat * LANE_H + 0.5); g.stroke();

    // probability traces: the maximum over the rows of each pixel column (short peaks stay visible)
    if (this.probs) {
      var cols = Math.max(1, Math.floor(PW));
      var span = r1 - r0;
      var perPx = span / cols;
      for (k = 0; k < this.L; k++) {
        var base = k * this.T, yb = L.lanes + (k + 1) * LANE_H - 1, h = LANE_H - 3;
        var hue = k >= nAnat ? "196, 78, 82" : "70, 110, 160";
        g.fillStyle = "rgba(" + hue + ", 0.16)";
        g.strokeStyle = "rgba(" + hue + ", 0.85)";
        g.lineWidth = 1;
        g.beginPath(); g.moveTo(LABEL_W, yb);
        if (perPx >= 1) {
          for (var cx = 0; cx < cols; cx++) {
            var a = Math.floor(r0 + cx * perPx), z = Math.min(this.T, Math.max(a + 1, Math.floor(r0 + (cx + 1) * perPx)));
            var m = 0;
            for (var r = a; r < z; r++) { var v = this.probs[base + r]; if (v > m) m = v; }
            var yy = yb - h * m / 255;
            g.lineTo(LABEL_W + cx, yy); g.lineTo(LABEL_W + cx + 1, yy);
          }
          g.lineTo(LABEL_W + cols, yb);
        } else {
          for (var rr = Math.floor(r0); rr < Math.min(this.T, Math.ceil(r1)); rr++) {
            var y2 = yb - h * this.probs[base + rr] / 255;
            g.lineTo(Math.max(LABEL_W, this.x(rr)), y2); g.lineTo(Math.min(LABEL_W + PW, this.x(rr + 1)), y2);
          }
          g.lineTo(Math.min(LABEL_W + PW, this.x(Math.ceil(r1))), yb);
        }
        g.closePath(); g.fill(); g.stroke();
      }
      // the lanes' baselines and the 0.5 level, so that the traces read as probabilities
      g.fillStyle = "rgba(0, 0, 0, 0.07)";
      for (k = 0; k < this.L; k++) g.fillRect(LABEL_W, L.lanes + k * LANE_H + 1 + (LANE_H - 3) / 2, PW, 1);
    }

    // ground truth: a band at the bottom of the lane
    if (this.gt) {
      g.fillStyle = "#e8862a";
      this.gt.forEach(function (e) {
        if (e.e + 1 < r0 || e.s > r1) return;
        var a = Math.max(LABEL_W, self.x(e.s)), z = Math.min(LABEL_W + PW, self.x(e.e + 1));
        e.label.forEach(function (n) {
          var y = L.lanes + self.labelIndex[n] * LANE_H;
          g.fillRect(a, y + LANE_H - 5, Math.max(2, z - a), 4);
        });
      });
    }

    // predicted and reviewed events
    var styles = {
      pending: ["rgba(31, 95, 168, 0.30)", "#1f5fa8"],
      accepted: ["rgba(34, 139, 84, 0.38)", "#1e7b4a"],
      rejected: ["rgba(120, 120, 120, 0.12)", "#9a9a9a"]
    };
    this.state.events.forEach(function (ev, i) {
      if (ev.e + 1 < r0 || ev.s > r1) return;
      var a = Math.max(LABEL_W, self.x(ev.s)), z = Math.min(LABEL_W + PW, self.x(ev.e + 1));
      var wdt = Math.max(2, z - a), st = styles[ev.status];
      ev.label.forEach(function (n) {
        var y = L.lanes + self.labelIndex[n] * LANE_H + 2;
        g.fillStyle = st[0]; g.fillRect(a, y, wdt, LANE_H - 8);
        g.fillStyle = st[1]; g.fillRect(a, y, wdt, 4);
        if (ev.status === "rejected") {
          g.strokeStyle = st[1]; g.lineWidth = 1; g.setLineDash([3, 2]);
          g.strokeRect(a + 0.5, y + 0.5, wdt - 1, LANE_H - 9); g.setLineDash([]);
        }
        if (i === self.sel) {
          g.strokeStyle = "#111"; g.lineWidth = 2;
          g.strokeRect(a - 1, y - 1, wdt + 2, LANE_H - 6);
        }
      });
    });

    // axis in the event file's units
    g.fillStyle = "#ffffff"; g.fillRect(0, L.axis, W, AXIS_H);
    g.strokeStyle = "#9aa3ad"; g.beginPath(); g.moveTo(LABEL_W, L.axis + 0.5); g.lineTo(LABEL_W + PW, L.axis + 0.5); g.stroke();
    var target = Math.max(2, Math.floor(PW / 110));
    var raw = (r1 - r0) / target, mag = Math.pow(10, Math.floor(Math.log10(Math.max(1, raw))));
    var stepRows = [1, 2, 5, 10].map(function (f) { return f * mag; }).find(function (s) { return s >= raw; }) || 10 * mag;
    stepRows = Math.max(1, Math.round(stepRows));
    g.fillStyle = "#333"; g.textAlign = "center"; g.font = "11px system-ui, sans-serif";
    for (var t = Math.ceil(r0 / stepRows) * stepRows; t < r1 && t < this.T; t += stepRows) {
      var tx = this.x(t + (r1 - r0 < PW / 8 ? 0.5 : 0));
      g.fillRect(tx, L.axis, 1, 4);
      g.fillText(fmt(this.ids[t]), tx, L.axis + 12);
    }
    g.textAlign = "right"; g.fillStyle = "#555";
    g.fillText(this.unitName, LABEL_W - 8, L.axis + 12);
  };

  ExamPage.prototype.renderStrip = function () {
    var self = this;
    if (!this.cssWidth) return;
    var PW = this.plotWidth(), n = Math.max(4, Math.floor(PW / 62));
    this.strip.textContent = "";
    this.strip.style.paddingLeft = LABEL_W + "px";
    var span = this.view.r1 - this.view.r0;
    var useFiles = this.d.frames.kind === "files" && span <= n * 3;
    for (var q = 0; q < n; q++) {
      var row = Math.min(this.T - 1, Math.floor(this.view.r0 + (q + 0.5) * span / n));
      var u = useFiles ? { url: this.frameUrl(row).url, row: row } : this.thumbUrl(row);
      var img = el("img", { src: u.url, alt: "", title: this.unitName + " " + fmt(this.ids[u.row]), dataset: { row: String(u.row) } });
      img.style.width = (PW / n - 4) + "px";
      img.addEventListener("click", function (e) { self.setFrame(Number(e.currentTarget.dataset.row), true); });
      this.strip.appendChild(img);
    }
  };

  ExamPage.prototype.bindTimeline = function () {
    var self = this, c = this.canvas, drag = null;
    var pos = function (e) { var r = c.getBoundingClientRect(); return { x: e.clientX - r.left, y: e.clientY - r.top }; };
    c.addEventListener("wheel", function (e) {
      var p = pos(e);
      if (p.x < LABEL_W) return;
      e.preventDefault();
      if (e.shiftKey || Math.abs(e.deltaX) > Math.abs(e.deltaY)) {
        var d = (e.deltaX || e.deltaY) / self.plotWidth() * (self.view.r1 - self.view.r0);
        self.setView(self.view.r0 + d, self.view.r1 + d);
      } else {
        self.zoom(e.deltaY > 0 ? 1.25 : 0.8, self.rowAt(p.x));
      }
    }, { passive: false });
    c.addEventListener("mousedown", function (e) {
      var p = pos(e);
      drag = { x: p.x, y: p.y, r0: self.view.r0, r1: self.view.r1, moved: false };
    });
    window.addEventListener("mousemove", function (e) {
      if (!drag) return;
      var p = pos(e);
      if (Math.abs(p.x - drag.x) > 3) drag.moved = true;
      if (drag.moved && drag.y > self.layout().band) {
        var d = (drag.x - p.x) / self.plotWidth() * (drag.r1 - drag.r0);
        self.setView(drag.r0 + d, drag.r1 + d);
      }
    });
    window.addEventListener("mouseup", function (e) {
      if (!drag) return;
      var p = pos(e), L = self.layout(), wasDrag = drag.moved, y0 = drag.y;
      drag = null;
      if (wasDrag || p.x < LABEL_W) return;
      if (y0 < L.band) {  // the overview bar: centre the view there
        var row = (p.x - LABEL_W) / self.plotWidth() * self.T, span = self.view.r1 - self.view.r0;
        self.setView(row - span / 2, row + span / 2);
        self.setFrame(row, true);
        return;
      }
      var r = Math.floor(self.rowAt(p.x));
      r = Math.max(0, Math.min(self.T - 1, r));
      var lane = Math.floor((p.y - L.lanes) / LANE_H);
      if (lane >= 0 && lane < self.L) {
        var name = self.labels[lane], tol = 3 / self.plotWidth() * (self.view.r1 - self.view.r0), hit = -1;
        self.state.events.forEach(function (ev, i) {
          if (hit < 0 && ev.label.indexOf(name) >= 0 && ev.s - tol <= r && r <= ev.e + tol) hit = i;
        });
        if (hit >= 0 && hit !== self.sel) self.select(hit, false);
      }
      self.setFrame(r, true);
    });
  };

  // ------------------------------------------------------------------------------------------- start
  function start() {
    try {
      if (window.VCE_EXAM) window.vceReview = new ExamPage(window.VCE_EXAM);
      else if (window.VCE_INDEX) renderIndex(window.VCE_INDEX);
      else document.body.appendChild(el("p", { text: "No review data found next to this page." }));
    } catch (err) {
      document.body.appendChild(el("pre", { className: "fatal", text: "The review page failed: " + (err && err.stack || err) }));
      throw err;
    }
  }

  window.VCEReviewTools = { exportedEvents: exportedEvents, reviewCounts: reviewCounts };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
