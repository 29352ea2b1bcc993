/*
 * Stoker's dashboard: reads /ui/api/overview every 2 s and /ui/api/history every
 * sample interval from the mgmtd that served the page, and draws them. No
 * library: the charts are SVG drawn here. Data is put into the page only through
 * textContent and attributes, never as HTML, so a target path or a client name
 * cannot inject markup. Read-only: the page only ever sends GETs.
 */
"use strict";

const SVGNS = "http://www.w3.org/2000/svg";
/* The charts' colours (dash.css has the same for the page). */
let intervalS = 10;
let lastOverview = 0;
/* where the charts come from: mgmtd's own samples, or Prometheus (--prometheus) */
let historySource = "";

/* ---- formatting ---- */

function fmtBytes(b) {
	if (b === null || b === undefined || !isFinite(b)) return "-";
	const u = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
	let i = 0;
	while (Math.abs(b) >= 1024 && i < u.length - 1) {
		b /= 1024;
		i++;
	}
	return (i === 0 ? b.toFixed(0) : b.toFixed(b < 10 ? 2 : 1)) + " " + u[i];
}

function fmtRate(b) {
	return b === null || b === undefined ? "-" : fmtBytes(b) + "/s";
}

function fmtNum(n) {
	if (n === null || n === undefined || !isFinite(n)) return "-";
	if (n >= 1e6) return (n / 1e6).toFixed(1) + "M";
	if (n >= 1e4) return (n / 1e3).toFixed(1) + "k";
	return n >= 100 ? n.toFixed(0) : n.toFixed(n >= 10 ? 1 : 2).replace(/\.?0+$/, "") || "0";
}

function fmtDur(s) {
	if (s === null || s === undefined || !isFinite(s)) return "-";
	if (s < 1e-3) return (s * 1e6).toFixed(0) + " µs";
	if (s < 1) return (s * 1e3).toFixed(s < 0.01 ? 2 : 1) + " ms";
	return s.toFixed(2) + " s";
}

function fmtAgo(ms) {
	let s = Math.max(0, Math.round(ms / 1000));
	if (s < 60) return s + " s";
	if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
	return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
}

function pct(x) {
	return x === null || x === undefined ? "-" : (100 * x).toFixed(1) + "%";
}

/* ---- DOM helpers ---- */

function $(id) {
	return document.getElementById(id);
}

function setText(id, text) {
	$(id).textContent = text;
}

function cell(tr, text, cls) {
	const td = document.createElement("td");
	td.textContent = text;
	if (cls) td.className = cls;
	tr.appendChild(td);
	return td;
}

function badgeCell(tr, text, cls) {
	const td = document.createElement("td");
	const span = document.createElement("span");
	span.className = "state " + cls;
	span.textContent = text;
	td.appendChild(span);
	tr.appendChild(td);
	return td;
}

function rows(tableId, items, fill) {
	const body = $(tableId).tBodies[0];
	const frag = document.createDocumentFragment();
	for (const it of items) {
		const tr = document.createElement("tr");
		fill(tr, it);
		frag.appendChild(tr);
	}
	body.replaceChildren(frag);
}

function stateClass(s) {
	if (s === "online" || s === "serving" || s === "ok") return "ok";
	if (s === "syncing" || s === "wiping" || s === "full" || s === "degraded") return "warning";
	return "critical";
}

/* ---- charts ---- */

function svgEl(name, attrs, parent) {
	const e = document.createElementNS(SVGNS, name);
	for (const k in attrs) e.setAttribute(k, attrs[k]);
	if (parent) parent.appendChild(e);
	return e;
}

function niceMax(v) {
	if (!(v > 0)) return 1;
	const p = Math.pow(10, Math.floor(Math.log10(v)));
	for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
	return 10 * p;
}

/*
 * Draws series ([{name, color, values}]) over times t (ms) into svg. A gap in
 * time (more than 2.5 intervals) or a null breaks a line. Sets data-points to the
 * number of values drawn and data-max to the largest, which the browser test reads.
 */
function chart(svg, t, series, fmt) {
	const W = 600, H = 190, L = 80, R = 10, T = 20, B = 18;
	svg.setAttribute("viewBox", "0 0 " + W + " " + H);
	svg.replaceChildren();
	let n = 0, max = 0;
	for (const s of series)
		for (const v of s.values)
			if (v !== null && isFinite(v)) {
				n++;
				max = Math.max(max, v);
			}
	svg.dataset.points = String(n);
	svg.dataset.max = String(max);
	if (!t.length || !n) {
		svgEl("text", {x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty"}, svg)
			.textContent = "no data yet";
		return;
	}
	const t1 = t[t.length - 1];
	const t0 = Math.min(t[0], t1 - intervalS * 1000);
	const ymax = niceMax(max);
	const x = (ms) => L + ((ms - t0) / (t1 - t0)) * (W - L - R);
	const y = (v) => T + (1 - v / ymax) * (H - T - B);
	for (let i = 0; i <= 4; i++) {
		const v = (ymax * i) / 4;
		svgEl("line", {x1: L, x2: W - R, y1: y(v), y2: y(v), class: "grid"}, svg);
		svgEl("text", {x: L - 4, y: y(v) + 3, "text-anchor": "end"}, svg).textContent = fmt(v);
	}
	svgEl("text", {x: L, y: H - 4}, svg).textContent = "-" + fmtAgo(t1 - t0);
	svgEl("text", {x: W - R, y: H - 4, "text-anchor": "end"}, svg).textContent = "now";
	let lx = L;
	for (const s of series) {
		svgEl("rect", {x: lx, y: 4, width: 10, height: 4, fill: s.color}, svg);
		svgEl("text", {x: lx + 13, y: 10}, svg).textContent = s.name;
		lx += 20 + s.name.length * 6;
		let seg = [];
		const flush = () => {
			if (seg.length === 1)
				svgEl("circle", {cx: seg[0][0], cy: seg[0][1], r: 2, fill: s.color}, svg);
			else if (seg.length > 1)
				svgEl("polyline", {points: seg.map((p) => p.join(",")).join(" "),
						   stroke: s.color, class: "line"}, svg);
			seg = [];
		};
		for (let i = 0; i < t.length; i++) {
			const v = s.values[i];
			if (i > 0 && t[i] - t[i - 1] > 2.5 * intervalS * 1000) flush();
			if (v === null || !isFinite(v)) {
				flush();
				continue;
			}
			seg.push([x(t[i]).toFixed(1), y(v).toFixed(1)]);
		}
		flush();
	}
}

function drawHistory(h) {
	const t = h.t_ms;
	if (h.source === "prometheus")
		historySource = "Charts from Prometheus at " + h.prometheus + ".";
	else if (h.prometheus)
		historySource = "Charts from mgmtd's own samples: Prometheus at " + h.prometheus +
			" does not answer (" + (h.prometheus_error || "no answer yet") + ").";
	else
		historySource = "";
	setText("chart-source", historySource);
	chart($("ch-tput"), t, [
		{name: "read", color: "#2f6fdf", values: h.read_bps},
		{name: "write", color: "#d9480f", values: h.write_bps},
	], fmtRate);
	chart($("ch-iops"), t, [
		{name: "read", color: "#2f6fdf", values: h.read_iops},
		{name: "write", color: "#d9480f", values: h.write_iops},
	], fmtNum);
	for (const [id, op] of [["ch-rlat", "read"], ["ch-wlat", "write"]])
		chart($(id), t, [
			{name: "p50", color: "#2f9e44", values: h[op + "_p50"]},
			{name: "p95", color: "#e8a317", values: h[op + "_p95"]},
			{name: "p99", color: "#c92a2a", values: h[op + "_p99"]},
		], fmtDur);
	chart($("ch-cap"), t, [
		{name: "used", color: "#2f6fdf", values: h.used},
		{name: "capacity", color: "#9aa1ad", values: h.capacity},
	], fmtBytes);
}

/* ---- the overview ---- */

function drawOverview(o) {
	intervalS = o.interval_s || intervalS;
	lastOverview = Date.now();
	setText("cluster", "mgmtd " + o.self + " (" + o.mode + ")");
	const banner = $("banner");
	if (!o.leading) {
		banner.hidden = false;
		banner.replaceChildren();
		banner.append("This mgmtd (" + o.self + ") follows; only the leader has the cluster's view. ");
		if (o.leader_ui) {
			const a = document.createElement("a");
			a.href = o.leader_ui;
			a.textContent = "Open the leader's dashboard (" + o.leader + ")";
			banner.append(a);
		} else {
			banner.append("No leader is known right now (an election may be under way).");
		}
		const h = $("health");
		h.className = "badge info";
		h.textContent = "follower";
		return;
	}
	banner.hidden = true;

	const h = $("health");
	h.className = "badge " + o.health.status;
	h.textContent = o.health.status === "ok" ? "healthy" : o.health.status;
	h.title = o.health.critical + " critical, " + o.health.warning + " warning";

	const nodesUp = o.nodes.filter((n) => n.state === "online").length;
	setText("c-nodes", nodesUp + " / " + o.nodes.length + " online");
	setText("c-nodes-sub", o.nodes.filter((n) => n.role === "storage").length + " storage, " +
		o.nodes.filter((n) => n.role === "meta").length + " meta");
	const serving = o.targets.filter((t) => t.state === "serving").length;
	setText("c-targets", serving + " / " + o.targets.length + " serving");
	setText("c-targets-sub", o.targets.filter((t) => t.state === "offline").length + " offline, " +
		o.targets.filter((t) => t.state === "syncing").length + " syncing");
	setText("c-chains", o.chains.healthy + " / " + o.chains.total + " healthy");
	setText("c-chains-sub", o.chains.degraded + " degraded, " + o.chains.unavailable + " unavailable");

	const c = o.capacity;
	setText("c-cap", pct(c.used_ratio) + " used");
	setText("c-cap-sub", fmtBytes(c.used) + " of " + fmtBytes(c.capacity) + ", " +
		fmtBytes(c.available) + " free, " + c.devices + " device(s)");
	const bar = $("c-cap-bar");
	bar.style.width = c.used_ratio ? Math.min(100, 100 * c.used_ratio).toFixed(1) + "%" : "0";
	bar.className = c.used_ratio > 0.8 ? "warning" : "";
	const f = c.forecast;
	let ft;
	if (f.growing === null)
		ft = "Forecast: not enough history yet (" + f.points + " samples)";
	else if (f.growing)
		ft = "Forecast: full in " + (f.days_to_full < 1 ? (f.days_to_full * 24).toFixed(1) + " hours"
			: f.days_to_full.toFixed(1) + " days") + " at " + fmtBytes(f.bytes_per_day) + "/day";
	else
		ft = "Forecast: not growing";
	setText("c-forecast", ft + (f.span_s ? " (over the last " + fmtAgo(f.span_s * 1000) + ")" : ""));
	$("c-forecast").dataset.growing = String(f.growing);

	const tp = o.throughput;
	setText("c-tput", "R " + fmtRate(tp.read_bps) + " · W " + fmtRate(tp.write_bps));
	setText("c-iops", "IOPS: " + fmtNum(tp.read_iops) + " read, " + fmtNum(tp.write_iops) + " write");
	setText("c-lat", tp.read_p99 === null && tp.write_p99 === null ? "idle"
		: fmtDur(tp.read_p99) + " / " + fmtDur(tp.write_p99));

	const now = o.generated_ms;
	rows("alerts", o.alerts, (tr, a) => {
		tr.dataset.alert = a.name;
		badgeCell(tr, a.severity, a.severity);
		cell(tr, a.name);
		cell(tr, a.summary).className = "path";
		cell(tr, fmtAgo(now - a.since_ms) + " ago");
	});
	$("alerts-none").hidden = o.alerts.length > 0;

	rows("nodes", o.nodes, (tr, n) => {
		tr.dataset.node = n.id;
		if (n.state !== "online") tr.className = "down";
		cell(tr, n.id, "num");
		cell(tr, n.role + (n.draining ? " (draining)" : "") + (n.refused ? " (refused)" : ""));
		badgeCell(tr, n.state, stateClass(n.state)).classList.add("nstate");
		cell(tr, n.addr);
		cell(tr, n.last_seen_s === null ? "-" : fmtAgo(n.last_seen_s * 1000) + " ago");
		cell(tr, n.role === "storage" ? fmtRate(n.read_bps) : "-", "num");
		cell(tr, n.role === "storage" ? fmtRate(n.write_bps) : "-", "num");
		cell(tr, n.role === "storage" ? fmtNum(n.read_iops) + " / " + fmtNum(n.write_iops) : "-", "num");
		cell(tr, n.tcp_retransmit_ratio === undefined ? "-" : pct(n.tcp_retransmit_ratio), "num");
		cell(tr, n.metrics);
	});

	rows("targets", o.targets, (tr, t) => {
		tr.dataset.target = t.id;
		if (t.state === "offline") tr.className = "down";
		cell(tr, t.id, "num");
		cell(tr, t.node, "num");
		badgeCell(tr, t.state + (t.state === "syncing" ? " " + (t.sync_permille / 10).toFixed(1) + "%" : ""),
			stateClass(t.state)).classList.add("tstate");
		cell(tr, t.path, "path");
		cell(tr, fmtBytes(t.used) + " of " + fmtBytes(t.capacity) +
			(t.capacity ? " (" + pct(t.used / t.capacity) + ")" : ""));
		cell(tr, fmtNum(t.chunks), "num");
		cell(tr, fmtRate(t.read_bps), "num");
		cell(tr, fmtRate(t.write_bps), "num");
		cell(tr, fmtDur(t.read_p99) + " / " + fmtDur(t.write_p99), "num");
		cell(tr, t.smart_healthy === undefined || t.smart_healthy === null ? "n/a"
			: t.smart_healthy ? "passed" : "FAILED");
	});

	$("chains-section").hidden = o.chains.unhealthy.length === 0;
	rows("chains", o.chains.unhealthy, (tr, ch) => {
		cell(tr, ch.id, "num");
		badgeCell(tr, ch.state, stateClass(ch.state));
		cell(tr, ch.members.map((m) => m.target + (m.state === "serving" ? "" : " (" + m.state + ")"))
			.join(", "));
	});

	drawJobs(o.jobs || []);

	rows("clients", o.clients, (tr, cl) => {
		cell(tr, cl.client);
		cell(tr, fmtRate(cl.read_bps), "num");
		cell(tr, fmtRate(cl.write_bps), "num");
		cell(tr, fmtNum(cl.requests_per_s) + "/s", "num");
	});
	$("clients-none").hidden = o.clients.length > 0;
	setText("footer", "Read-only view. mgmtd samples the nodes' /metrics every " + intervalS +
		" s and keeps the last " + fmtAgo(intervalS * 360000) + " (docs/dashboard.md). Stoker " +
		o.version + ".");
}

/*
 * Training jobs (stoker.jobs.JobMonitor): what share of its time each waited for
 * data over its last report's window, and whether that makes it data-bound (10% or
 * more: its accelerators under 90% busy, the MLPerf Storage rule).
 */
function jobVerdict(j) {
	if (!(j.window_s > 0)) return ["starting", "info"];
	if (j.data_bound) return ["data-bound", "warning"];
	if (!(j.samples_per_s > 0)) return ["no batches", "info"];
	return ["compute-bound", "ok"];
}

function drawJobs(jobs) {
	const bound = jobs.filter((j) => j.data_bound).length;
	setText("c-jobs", jobs.length ? String(jobs.length) : "none");
	setText("c-jobs-sub", jobs.length ? (bound ? bound + " data-bound" : "none data-bound") :
		"no job reports here");
	$("c-jobs").className = "big" + (bound ? " warn-text" : "");
	rows("jobs", jobs, (tr, j) => {
		const [verdict, cls] = jobVerdict(j);
		if (j.data_bound) tr.className = "slow";
		cell(tr, j.name, "path");
		cell(tr, j.rank >= 0 ? String(j.rank) : "-", "num");
		cell(tr, j.host + " / " + j.pid);
		const td = cell(tr, j.window_s > 0 ? pct(j.data_wait_ratio) : "-", "num");
		td.title = "waited " + fmtDur(j.data_wait_s) + " in all, " + fmtDur(j.data_wait_ratio * j.window_s) +
			" of the last " + fmtDur(j.window_s);
		badgeCell(tr, verdict, cls);
		cell(tr, j.window_s > 0 ? fmtNum(j.samples_per_s) : "-", "num");
		cell(tr, j.window_s > 0 ? fmtRate(j.bytes_per_s) : "-", "num");
		cell(tr, fmtNum(j.steps), "num");
		if (j.checkpoint_save_age_s === null)
			cell(tr, "none yet");
		else
			cell(tr, fmtAgo(j.checkpoint_save_age_s * 1000) + " ago, " + fmtDur(j.checkpoint_save_s) +
				(j.checkpoint_save_bytes !== null ? ", " + fmtBytes(j.checkpoint_save_bytes) : ""));
		cell(tr, fmtAgo(j.age_s * 1000) + " ago");
	});
	$("jobs-none").hidden = jobs.length > 0;
}

/* ---- the loop ---- */

async function getJSON(path) {
	const r = await fetch(path, {cache: "no-store"});
	if (!r.ok) throw new Error(path + ": HTTP " + r.status);
	return r.json();
}

async function refreshOverview() {
	try {
		drawOverview(await getJSON("/ui/api/overview"));
	} catch (e) {
		const b = $("banner");
		b.hidden = false;
		b.textContent = "Cannot reach mgmtd: " + e.message + ". Retrying.";
	}
	setTimeout(refreshOverview, 2000);
}

async function refreshHistory() {
	try {
		drawHistory(await getJSON("/ui/api/history"));
	} catch (e) {
		/* the overview's banner says mgmtd cannot be reached */
	}
	setTimeout(refreshHistory, Math.max(2000, intervalS * 1000));
}

function tick() {
	if (lastOverview)
		setText("updated", "updated " + fmtAgo(Date.now() - lastOverview) + " ago");
}

refreshOverview();
refreshHistory();
setInterval(tick, 1000);
