/*
 * mlinfra monitoring dashboard.
 *
 * Served by Prometheus itself (--web.user-assets) under /user/, so the API is same-origin at
 * ../api/v1/ and the page needs no web server, no CORS and no build step. Plain DOM + uPlot
 * (vendored by scripts/build-dashboard-vendor.sh).
 *
 * Rules kept throughout:
 *  - label values come from scraped targets, so they only ever reach the DOM through
 *    textContent / attributes, never innerHTML;
 *  - every refresh updates the existing cards in place (keyed by host / domain / GPU), so the
 *    charts are not rebuilt and the page does not flicker;
 *  - an unreachable Prometheus shows a banner and keeps the last data (dimmed), never a blank page.
 */
(function () {
  'use strict';

  const DEFAULTS = {
    title: 'mlinfra dashboard',
    refresh_seconds: 15,
    range_minutes: 60,
    mlflow_url: '',
    scrape_interval_seconds: 15,   // the role's Prometheus scrape interval: sizes the rate() windows
  };
  const API = '../api/v1/';
  const CHART_HEIGHT = 96;
  const PALETTE = ['#58a6ff', '#f0883e', '#3fb950', '#d2a8ff', '#ff7b72', '#e3b341'];
  const AXIS_COLOR = '#8b949e';
  const GRID_COLOR = 'rgba(139,148,158,0.14)';
  // Filesystems that are not storage (and would otherwise top the "largest mounts" list).
  const FS_FILTER = 'fstype!~"tmpfs|ramfs|devtmpfs|overlay|squashfs|nsfs|autofs|fuse\\\\..*"';
  // libvirt's virDomainState.
  const DOMAIN_STATES = {
    0: ['no state', 'warn'], 1: ['running', 'ok'], 2: ['blocked', 'warn'], 3: ['paused', 'warn'],
    4: ['shutting down', 'warn'], 5: ['shut off', 'off'], 6: ['crashed', 'bad'], 7: ['suspended', 'warn'],
  };
  const SEVERITY_ORDER = { critical: 0, error: 1, warning: 2, info: 3 };

  const state = {
    config: Object.assign({}, DEFAULTS),
    window: null,          // the time window of the refresh being drawn (charts' x range reads it)
    lastSuccess: null,     // Date of the last refresh that reached Prometheus
    timer: null,
    charts: new Map(),     // chart box element -> uPlot instance
  };

  // ------------------------------------------------------------------ DOM helpers

  /** h('div', {class: 'x', text: 'y', title: 'z'}, child...) - text is always textContent. */
  function h(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === 'class') node.className = value;
      else if (key === 'text') node.textContent = String(value);
      else if (key === 'dataset') Object.assign(node.dataset, value);
      else node.setAttribute(key, String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function setText(node, text) {
    const value = String(text);
    if (node.textContent !== value) node.textContent = value;
  }

  function badge(text, kind) {
    return h('span', { class: 'badge badge-' + kind, text });
  }

  /** Change a badge's text and colour; other classes on it (hooks for tests, CSS) stay. */
  function setBadge(node, text, kind) {
    setText(node, text);
    for (const cls of Array.from(node.classList)) if (cls.startsWith('badge-')) node.classList.remove(cls);
    node.classList.add('badge', 'badge-' + kind);
  }

  /**
   * Keep exactly one child per item in `container`, in the items' order. Existing nodes are
   * updated (not recreated) so their charts survive; nodes of vanished items are removed.
   */
  function syncKeyed(container, items, keyOf, make, update) {
    const existing = new Map();
    for (const child of Array.from(container.children)) existing.set(child.dataset.key, child);
    let previous = null;
    for (const item of items) {
      const key = keyOf(item);
      let node = existing.get(key);
      if (node) {
        existing.delete(key);
      } else {
        node = make(item);
        node.dataset.key = key;
      }
      // Insert before updating: a new chart measures its width from the laid-out page.
      const wanted = previous ? previous.nextSibling : container.firstChild;
      if (node !== wanted) container.insertBefore(node, wanted);
      update(node, item);
      previous = node;
    }
    for (const node of existing.values()) {
      destroyCharts(node);
      node.remove();
    }
  }

  /** A section's body: one note line (empty state / errors) and one list of items. */
  function sectionParts(id) {
    const body = document.querySelector('#' + id + ' .body');
    if (!body.firstChild) {
      body.appendChild(h('p', { class: 'note', hidden: true }));
      body.appendChild(h('div', { class: 'list' }));
    }
    return { note: body.querySelector('.note'), list: body.querySelector('.list') };
  }

  function setNote(parts, text, kind) {
    parts.note.hidden = !text;
    setText(parts.note, text || '');
    parts.note.className = 'note' + (kind ? ' note-' + kind : '');
  }

  // ------------------------------------------------------------------ formatting

  function isNum(v) {
    return typeof v === 'number' && Number.isFinite(v);
  }

  function fmtNum(v, digits) {
    if (!isNum(v)) return '–';
    const abs = Math.abs(v);
    if (abs >= 100 || v === 0) return v.toFixed(0);
    if (abs >= 10) return v.toFixed(Math.min(digits === undefined ? 1 : digits, 1));
    return v.toFixed(digits === undefined ? 2 : digits);
  }

  function fmtPct(v) {
    return isNum(v) ? fmtNum(v, 1) + ' %' : '–';
  }

  function fmtBytes(v, short) {
    if (!isNum(v)) return '–';
    const units = short ? ['', 'K', 'M', 'G', 'T', 'P'] : ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
    let i = 0;
    let x = Math.abs(v);
    while (x >= 1024 && i < units.length - 1) {
      x /= 1024;
      i += 1;
    }
    const sign = v < 0 ? '-' : '';
    return sign + (x >= 100 || i === 0 ? x.toFixed(0) : x.toFixed(1)) + (short ? '' : ' ') + units[i];
  }

  /** Compact byte axis label: "20K", "1.5G" (binary units, no trailing ".0"). */
  function fmtBytesAxis(v) {
    return fmtBytes(v, true).replace(/\.0(?=[A-Z]|$)/, '');
  }

  function fmtRate(v) {
    return isNum(v) ? fmtBytes(v) + '/s' : '–';
  }

  function fmtDuration(seconds) {
    if (!isNum(seconds)) return '–';
    if (seconds < 60) return seconds.toFixed(seconds < 10 ? 1 : 0) + ' s';
    const s = Math.round(seconds);
    if (s < 3600) return Math.floor(s / 60) + ' min ' + String(s % 60).padStart(2, '0') + ' s';
    if (s < 86400) return Math.floor(s / 3600) + ' h ' + String(Math.floor(s / 60) % 60).padStart(2, '0') + ' min';
    return Math.floor(s / 86400) + ' d ' + Math.floor(s / 3600) % 24 + ' h';
  }

  /** "5 min ago" for a Unix timestamp in seconds. Clock skew never yields "in -3 s". */
  function fmtAgo(ts) {
    if (!isNum(ts) || ts <= 0) return '–';
    const age = Math.max(0, Date.now() / 1000 - ts);
    if (age < 10) return 'just now';
    if (age < 90) return Math.round(age) + ' s ago';
    if (age < 5400) return Math.round(age / 60) + ' min ago';
    if (age < 172800) return Math.round(age / 3600) + ' h ago';
    return Math.round(age / 86400) + ' d ago';
  }

  function pad2(n) {
    return String(n).padStart(2, '0');
  }

  /** 24-hour clock: unambiguous on an operations screen, whatever the browser's locale. */
  function fmtClock(date) {
    return pad2(date.getHours()) + ':' + pad2(date.getMinutes()) + ':' + pad2(date.getSeconds());
  }

  /** Time-axis labels: seconds only on short windows, the date only on multi-day ones. */
  function fmtTick(ts, spanSeconds) {
    const d = new Date(ts * 1000);
    const hm = pad2(d.getHours()) + ':' + pad2(d.getMinutes());
    if (spanSeconds <= 600) return hm + ':' + pad2(d.getSeconds());
    if (spanSeconds > 2 * 86400) return pad2(d.getDate()) + '.' + pad2(d.getMonth() + 1) + ' ' + hm;
    return hm;
  }

  /** "1 min", "6 h", "2 d" for the time-range label. */
  function fmtSpan(minutes) {
    if (minutes % 1440 === 0) return minutes / 1440 + ' d';
    if (minutes % 60 === 0) return minutes / 60 + ' h';
    return minutes + ' min';
  }

  function fmtIso(ts) {
    return isNum(ts) && ts > 0 ? new Date(ts * 1000).toLocaleString() : '';
  }

  // ------------------------------------------------------------------ Prometheus API

  /** unreachable: the server did not answer (the banner case) rather than rejecting a query. */
  class PromError extends Error {
    constructor(message, unreachable) {
      super(message);
      this.unreachable = unreachable;
    }
  }

  async function promGet(endpoint, params) {
    const url = API + endpoint + (params ? '?' + new URLSearchParams(params).toString() : '');
    let response;
    try {
      // A server that accepts but never answers (stopped, overloaded) must not freeze the
      // refresh loop: give up after one refresh period, which also raises the banner.
      const timeout = clamp(state.config.refresh_seconds * 1000, 5000, 30000);
      response = await fetch(url, {
        cache: 'no-store', headers: { Accept: 'application/json' }, signal: AbortSignal.timeout(timeout),
      });
    } catch (err) {
      throw new PromError('no answer from Prometheus (' + err.message + ')', true);
    }
    let body = null;
    try {
      body = await response.json();
    } catch (err) {
      // Not Prometheus' JSON: a proxy error page or a half-dead server.
      throw new PromError('HTTP ' + response.status + ' from ' + endpoint + ' (not an API answer)', true);
    }
    if (!response.ok || body.status !== 'success') {
      throw new PromError(endpoint + ': ' + (body.error || 'HTTP ' + response.status), response.status >= 500);
    }
    return body.data;
  }

  function sampleValue(text) {
    const v = parseFloat(text);
    return Number.isFinite(v) ? v : null;   // NaN and ±Inf do not belong on a chart
  }

  /** Instant query -> [{labels, value}]. */
  async function instant(expr) {
    const data = await promGet('query', { query: expr });
    return data.result.map((r) => ({ labels: r.metric, value: sampleValue(r.value[1]) }));
  }

  /**
   * Range query over the current window -> [{labels, values, last}], values aligned on the
   * window's grid (state.window.xs) so several series can share one uPlot data table.
   */
  async function range(expr, win) {
    const data = await promGet('query_range', {
      query: expr, start: win.start, end: win.end, step: win.step,
    });
    return data.result.map((r) => {
      const values = new Array(win.xs.length).fill(null);
      for (const [t, v] of r.values) {
        const i = Math.round((t - win.start) / win.step);
        if (i >= 0 && i < values.length) values[i] = sampleValue(v);
      }
      return { labels: r.metric, values, last: lastValue(values) };
    });
  }

  function lastValue(values) {
    for (let i = values.length - 1; i >= 0; i -= 1) if (values[i] !== null) return values[i];
    return null;
  }

  /**
   * The time grid for this refresh: about 300 points, the last one at "now". Not aligned on
   * the step: an aligned end lags up to a step behind, and the latest values shown beside the
   * charts (and a young Prometheus' only samples) would fall outside the window.
   */
  function timeWindow() {
    const rangeSeconds = state.config.range_minutes * 60;
    const step = Math.max(1, Math.ceil(rangeSeconds / 300));
    const end = Math.round(Date.now()) / 1000;
    const start = end - rangeSeconds;
    const xs = [];
    for (let i = 0; i * step <= rangeSeconds; i += 1) xs.push(start + i * step);
    // Grafana's $__rate_interval: at least 4 scrapes (rate() needs two samples even when one
    // scrape is missed) and never less than a step plus a scrape, so no sample is skipped.
    // Not wider: rate() divides by the whole window, so a wide one under-reads young series.
    const scrape = state.config.scrape_interval_seconds;
    const rateWindow = Math.max(step + scrape, 4 * scrape) + 's';
    return { start, end, step, xs, rate: rateWindow };
  }

  /** Group results by a key function: key -> first result with that key. */
  function byKey(results, keyOf) {
    const map = new Map();
    for (const r of results) {
      const key = keyOf(r.labels);
      if (!map.has(key)) map.set(key, r);
    }
    return map;
  }

  // ------------------------------------------------------------------ charts

  const resizeObserver = new ResizeObserver((entries) => {
    for (const entry of entries) {
      const chart = state.charts.get(entry.target);
      const width = Math.floor(entry.contentRect.width);
      if (chart && width > 0 && width !== chart.width) chart.setSize({ width, height: CHART_HEIGHT });
    }
  });

  function destroyCharts(root) {
    for (const box of root.querySelectorAll('.chart-box')) {
      const chart = state.charts.get(box);
      if (chart) chart.destroy();
      state.charts.delete(box);
      resizeObserver.unobserve(box);
    }
  }

  // Chart kinds. A spec: {title, format (head values), axisFormat, splits, min, max, emptyMax, stepped}.
  function pctChart(title) {
    return { title, format: fmtPct, axisFormat: (v) => v.toFixed(0) + ' %', min: 0, max: 100 };
  }

  /** Bytes (or `factor` bytes, e.g. MiB) with ticks on round binary sizes. */
  function bytesChart(title, format, factor) {
    const f = factor || 1;
    return {
      title, format: (v) => format(isNum(v) ? v * f : v), axisFormat: (v) => fmtBytesAxis(v * f),
      splits: byteSplits(f), min: 0, emptyMax: 1024 / f,
    };
  }

  function unitChart(title, unit, emptyMax) {
    return {
      title, format: (v) => (isNum(v) ? v.toFixed(0) + ' ' + unit : '–'),
      axisFormat: (v) => v.toFixed(0) + ' ' + unit, min: 0, emptyMax,
    };
  }

  /** Axis splits at 1, 2, 2.5 or 5 x 1024^k bytes (uPlot's own are decimal: "46.6G" ticks). */
  function byteSplits(factor) {
    return (u, axisIdx, min, max) => {
      const span = (max - min) * factor;
      if (!(span > 0)) return [min];
      const target = span / 3.5;                     // 3-4 ticks fit a 96 px chart
      const unit = Math.pow(1024, Math.max(0, Math.floor(Math.log(target) / Math.log(1024))));
      const mult = [1, 2, 2.5, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1024].find((m) => m * unit >= target);
      const step = mult * unit / factor;
      const splits = [];
      for (let v = Math.ceil(min / step) * step; v <= max + step * 1e-9; v += step) splits.push(v);
      return splits;
    };
  }

  /**
   * A titled chart slot: title, one value label per series (latest value, or the value under
   * the cursor), and the box uPlot draws into. spec: {title, format, min, max, stepped}.
   */
  function chartSlot(spec) {
    const slot = h('div', { class: 'chart' },
      h('div', { class: 'chart-head' }, h('span', { class: 'chart-title', text: spec.title }),
        h('span', { class: 'chart-values' })),
      h('div', { class: 'chart-box' }));
    slot.spec = spec;
    return slot;
  }

  function yRange(spec) {
    return (u, dataMin, dataMax) => {
      const min = spec.min !== undefined ? spec.min : Math.min(0, dataMin || 0);
      let max = spec.max !== undefined ? spec.max : dataMax;
      if (!isNum(max) || max <= min) max = min + (spec.emptyMax || 1);
      else if (spec.max === undefined) max = max * 1.15;
      return [min, max];
    };
  }

  /** Show per-series values in the chart head: at the cursor when hovering, else the latest. */
  function showChartValues(slot, u, idx) {
    const spec = slot.spec;
    const target = slot.querySelector('.chart-values');
    const parts = [];
    for (let s = 1; s < u.series.length; s += 1) {
      const values = u.data[s];
      const v = idx === null || idx === undefined ? lastValue(values) : values[idx];
      const name = u.series.length > 2 ? u.series[s].label + ' ' : '';
      parts.push({ text: name + spec.format(v), color: u.series[s].stroke(u, s) });
    }
    // Rebuild only when the text changed: this runs on every mouse move.
    const key = parts.map((p) => p.text).join('|');
    if (target.dataset.shown === key) return;
    target.dataset.shown = key;
    target.replaceChildren(...parts.map((p) => h('span', { class: 'chart-value', style: 'color:' + p.color, text: p.text })));
  }

  /** A sample with no neighbour draws no line segment: mark it, so a lone sample is visible. */
  function isolatedPoints(u, seriesIdx, show) {
    if (show) return null;   // uPlot already draws every point (sparse data)
    const d = u.data[seriesIdx];
    const lone = [];
    for (let i = 0; i < d.length; i += 1) {
      if (d[i] !== null && d[i - 1] == null && d[i + 1] == null) lone.push(i);
    }
    return lone.length ? lone : null;
  }

  function makePlot(slot, box, series) {
    const spec = slot.spec;
    const axisFont = '10px system-ui, sans-serif';
    const opts = {
      width: Math.max(120, Math.floor(box.clientWidth)),
      height: CHART_HEIGHT,
      legend: { show: false },
      cursor: { drag: { x: false, y: false }, points: { size: 5 } }, // zooming would be undone by the next refresh
      scales: {
        x: { time: true, range: () => [state.window.start, state.window.end] },
        y: { range: yRange(spec) },
      },
      axes: [
        {
          stroke: AXIS_COLOR, font: axisFont, size: 20, space: 70, grid: { stroke: GRID_COLOR, width: 1 }, ticks: { show: false },
          values: (u, splits) => splits.map((t) => fmtTick(t, state.window.end - state.window.start)),
        },
        {
          stroke: AXIS_COLOR, font: axisFont, size: 44, space: 26, grid: { stroke: GRID_COLOR, width: 1 }, ticks: { show: false },
          values: (u, splits) => splits.map((v) => (spec.axisFormat || spec.format)(v)),
          splits: spec.splits,
        },
      ],
      series: [{}].concat(series.map((s, i) => {
        const color = s.color || PALETTE[i % PALETTE.length];
        return {
          label: s.label,
          stroke: color,
          width: 1.5,
          fill: series.length === 1 ? color + '22' : undefined,
          paths: spec.stepped ? uPlot.paths.stepped({ align: 1 }) : undefined,
          points: { size: 4, filter: isolatedPoints },
        };
      })),
      hooks: {
        setCursor: [(u) => showChartValues(slot, u, u.cursor.idx)],
        // The browser test waits for this: the number of points uPlot actually had to draw.
        draw: [(u) => {
          let points = 0;
          for (let s = 1; s < u.data.length; s += 1) points += u.data[s].filter((v) => v !== null).length;
          box.dataset.drawnPoints = String(points);
        }],
      },
    };
    return new uPlot(opts, null, box);
  }

  /** Draw (or redraw) a chart slot with series [{label, values, color?}] on the window's grid. */
  function drawChart(slot, series) {
    const box = slot.querySelector('.chart-box');
    const labels = series.map((s) => s.label).join('\u0000');
    let chart = state.charts.get(box);
    if (chart && chart.seriesKey !== labels) {
      chart.destroy();
      chart = null;
    }
    if (!chart) {
      chart = makePlot(slot, box, series);
      chart.seriesKey = labels;
      state.charts.set(box, chart);
      resizeObserver.observe(box);
    }
    slot.classList.toggle('chart-empty', series.every((s) => lastValue(s.values) === null));
    chart.setData([state.window.xs].concat(series.map((s) => s.values)));
    showChartValues(slot, chart, chart.cursor.idx);
  }

  function emptySeries(label) {
    return { label, values: new Array(state.window.xs.length).fill(null) };
  }

  // ------------------------------------------------------------------ section: hypervisors

  const HV = 'job="node",role="hypervisor"';

  /**
   * Hypervisors in maintenance (playbooks/hypervisor_maintenance.yml writes the textfile metric
   * mlinfra_hypervisor_maintenance 1 and its start time on the hypervisor's node exporter and
   * removes it when done): host -> {since}. A hypervisor that is down now (rebooting) counts as
   * in maintenance when the marker was there at its last successful scrape in the window; one
   * whose marker was gone while it was still up has finished, whatever it does since.
   * Shared by the hypervisor and VM sections: one set of queries per refresh.
   */
  const maintenanceByWindow = new WeakMap();

  function loadMaintenance(win) {
    if (!maintenanceByWindow.has(win)) maintenanceByWindow.set(win, queryMaintenance(win));
    return maintenanceByWindow.get(win);
  }

  async function queryMaintenance(win) {
    const [up, marker, start] = await Promise.all([
      range(`up{${HV}}`, win),
      range(`max by (host, instance) (mlinfra_hypervisor_maintenance{${HV}})`, win),
      range(`max by (host, instance) (mlinfra_hypervisor_maintenance_start_timestamp_seconds{${HV}})`, win),
    ]);
    const host = (l) => l.host || l.instance;
    const markerBy = byKey(marker, host);
    const startBy = byKey(start, host);
    const result = new Map();
    for (const [name, u] of byKey(up, host)) {
      const m = markerBy.get(name);
      if (!m) continue;
      // The last step at which the hypervisor was scraped: the marker as that scrape saw it.
      let i = u.values.length - 1;
      while (i >= 0 && u.values[i] !== 1) i -= 1;
      if (i < 0 || m.values[i] !== 1) continue;
      const s = startBy.get(name);
      const since = s ? (s.values[i] !== null ? s.values[i] : s.last) : null;
      result.set(name, { since: isNum(since) && since > 0 ? since : null });
    }
    return result;
  }

  /** "maintenance since 14:05 (25 min)"; the start time in the browser's clock, 24-hour. */
  function fmtMaintenance(m) {
    if (!m.since) return 'maintenance';
    const d = new Date(m.since * 1000);
    const minutes = Math.max(0, Math.floor((Date.now() / 1000 - m.since) / 60));
    const age = minutes < 120 ? minutes + ' min' : Math.floor(minutes / 60) + ' h ' + pad2(minutes % 60) + ' min';
    return 'maintenance since ' + pad2(d.getHours()) + ':' + pad2(d.getMinutes()) + ' (' + age + ')';
  }

  async function loadHypervisors(win) {
    const [maintenance, up, cpu, mem, memTotal, cpus, boot, fsSize, fsAvail] = await Promise.all([
      loadMaintenance(win),
      range(`up{${HV}}`, win),
      range(`100 * (1 - avg by (host) (rate(node_cpu_seconds_total{${HV},mode="idle"}[${win.rate}])))`, win),
      range(`100 * (1 - sum by (host) (node_memory_MemAvailable_bytes{${HV}}) / sum by (host) (node_memory_MemTotal_bytes{${HV}}))`, win),
      instant(`sum by (host) (node_memory_MemTotal_bytes{${HV}})`),
      instant(`count by (host) (node_cpu_seconds_total{${HV},mode="idle"})`),
      instant(`max by (host) (node_boot_time_seconds{${HV}})`),
      instant(`node_filesystem_size_bytes{${HV},${FS_FILTER}}`),
      range(`node_filesystem_avail_bytes{${HV},${FS_FILTER}}`, win),
    ]);
    const host = (l) => l.host || l.instance;
    const cpuBy = byKey(cpu, host);
    const memBy = byKey(mem, host);
    const memTotalBy = byKey(memTotal, host);
    const cpusBy = byKey(cpus, host);
    const bootBy = byKey(boot, host);
    const mounts = largestMounts(fsSize, fsAvail);
    const hosts = Array.from(byKey(up, host).values())
      .map((r) => {
        const name = host(r.labels);
        return {
          name,
          up: r,
          cpu: cpuBy.get(name),
          mem: memBy.get(name),
          memTotal: (memTotalBy.get(name) || {}).value,
          cpus: (cpusBy.get(name) || {}).value,
          boot: (bootBy.get(name) || {}).value,
          mounts: mounts.get(name) || [],
          maintenance: maintenance.get(name) || null,
        };
      })
      .sort((a, b) => a.name.localeCompare(b.name));
    return { hosts };
  }

  /** Per host: the 3 largest real filesystems (one mount per device), with free-space series. */
  function largestMounts(sizes, avails) {
    const availBy = byKey(avails, (l) => (l.host || l.instance) + '\u0000' + l.mountpoint);
    const perHost = new Map();
    for (const s of sizes) {
      const host = s.labels.host || s.labels.instance;
      if (!perHost.has(host)) perHost.set(host, new Map());
      const devices = perHost.get(host);
      const current = devices.get(s.labels.device);
      // A device bind-mounted in several places counts once, under its shortest path.
      if (!current || s.labels.mountpoint.length < current.mountpoint.length) {
        devices.set(s.labels.device, {
          mountpoint: s.labels.mountpoint, fstype: s.labels.fstype, device: s.labels.device,
          size: s.value, avail: availBy.get(host + '\u0000' + s.labels.mountpoint),
        });
      }
    }
    const result = new Map();
    for (const [host, devices] of perHost) {
      result.set(host, Array.from(devices.values()).sort((a, b) => (b.size || 0) - (a.size || 0)).slice(0, 3));
    }
    return result;
  }

  function makeHostCard() {
    const card = h('article', { class: 'card host-card' },
      h('div', { class: 'card-head' },
        h('span', { class: 'card-title' }), h('span', { class: 'badge host-state' }),
        h('span', { class: 'badge badge-info hv-maintenance', hidden: true }), h('span', { class: 'card-sub' })),
      h('div', { class: 'charts charts-4' },
        chartSlot({ title: 'Scrape up', format: (v) => (v === null ? '–' : v >= 1 ? 'up' : 'down'), axisFormat: (v) => (v >= 1 ? 'up' : v <= 0 ? 'down' : ''), min: 0, max: 1.05, stepped: true }),
        chartSlot(pctChart('CPU busy')),
        chartSlot(pctChart('Memory used')),
        chartSlot(bytesChart('Free space', fmtBytes))),
      h('ul', { class: 'mounts' }));
    return card;
  }

  function updateHostCard(card, host) {
    const isUp = host.up.last === 1;
    card.dataset.host = host.name;
    setText(card.querySelector('.card-title'), host.name);
    const inMaintenance = Boolean(host.maintenance);
    // Down in maintenance (a reboot) is expected: not red.
    setBadge(card.querySelector('.host-state'), host.up.last === null ? 'unknown' : isUp ? 'UP' : 'DOWN',
      host.up.last === null ? 'off' : isUp ? 'ok' : inMaintenance ? 'warn' : 'bad');
    const maint = card.querySelector('.hv-maintenance');
    maint.hidden = !inMaintenance;
    setText(maint, inMaintenance ? fmtMaintenance(host.maintenance) : '');
    maint.title = inMaintenance && host.maintenance.since
      ? 'playbooks/hypervisor_maintenance.yml started ' + fmtIso(host.maintenance.since)
        + '; its alerts are silenced in Alertmanager' : '';
    if (inMaintenance && host.maintenance.since) maint.dataset.since = String(host.maintenance.since);
    else delete maint.dataset.since;
    card.classList.toggle('in-maintenance', inMaintenance);
    const facts = [];
    if (isNum(host.cpus)) facts.push(host.cpus + ' CPUs');
    if (isNum(host.memTotal)) facts.push(fmtBytes(host.memTotal) + ' RAM');
    if (isNum(host.boot)) facts.push('booted ' + fmtAgo(host.boot));
    setText(card.querySelector('.card-sub'), facts.join(' · '));
    card.classList.toggle('is-down', !isUp && !inMaintenance);

    const slots = card.querySelectorAll('.chart');
    drawChart(slots[0], [{ label: 'up', values: host.up.values, color: '#3fb950' }]);
    drawChart(slots[1], [host.cpu ? { label: 'busy', values: host.cpu.values } : emptySeries('busy')]);
    drawChart(slots[2], [host.mem ? { label: 'used', values: host.mem.values, color: '#d2a8ff' } : emptySeries('used')]);
    const withSeries = host.mounts.filter((m) => m.avail);
    // Scaled to the largest filesystem: a line near the floor means "nearly full".
    slots[3].spec.max = Math.max(0, ...withSeries.map((m) => m.size || 0)) || undefined;
    drawChart(slots[3], withSeries.length
      ? withSeries.map((m) => ({ label: m.mountpoint, values: m.avail.values }))
      : [emptySeries('free')]);

    syncKeyed(card.querySelector('.mounts'), host.mounts, (m) => m.mountpoint, makeMountRow, updateMountRow);
  }

  function makeMountRow() {
    return h('li', { class: 'mount' },
      h('span', { class: 'mount-path' }), h('span', { class: 'meter' }, h('span', { class: 'meter-fill' })),
      h('span', { class: 'mount-free' }));
  }

  function updateMountRow(row, m) {
    const avail = m.avail ? m.avail.last : null;
    const usedPct = isNum(avail) && m.size > 0 ? 100 * (1 - avail / m.size) : null;
    const path = row.querySelector('.mount-path');
    setText(path, m.mountpoint);
    path.title = m.device + ' (' + m.fstype + ')';
    const fill = row.querySelector('.meter-fill');
    fill.style.width = (isNum(usedPct) ? usedPct.toFixed(1) : 0) + '%';
    fill.className = 'meter-fill' + (usedPct > 90 ? ' meter-bad' : usedPct > 75 ? ' meter-warn' : '');
    setText(row.querySelector('.mount-free'), fmtBytes(avail) + ' free of ' + fmtBytes(m.size)
      + (isNum(usedPct) ? ' (' + usedPct.toFixed(0) + ' % used)' : ''));
  }

  function renderHypervisors(model) {
    const parts = sectionParts('sec-hypervisors');
    setNote(parts, model.hosts.length ? '' : 'No hypervisor is scraped (job="node", role="hypervisor").', 'muted');
    syncKeyed(parts.list, model.hosts, (x) => x.name, makeHostCard, updateHostCard);
    return {
      hypervisors: model.hosts.length,
      hypervisorsDown: model.hosts.filter((x) => x.up.last !== 1 && !x.maintenance).length,
      hypervisorsMaintenance: model.hosts.filter((x) => x.maintenance).length,
    };
  }

  // ------------------------------------------------------------------ section: VMs

  const LV = 'job="libvirt"';

  async function loadVms(win) {
    const perDomain = (metric) => `sum by (host, domain) (rate(${metric}{${LV}}[${win.rate}]))`;
    const [maintenance, states, allStates, vcpus, memory, nodeUp, cpu, rd, wr, rx, tx] = await Promise.all([
      loadMaintenance(win),
      instant(`libvirt_domain_state_code{${LV}}`),
      // Every domain libvirt defines, running or not (the hypervisor's mlinfra-vm-state
      // collector): the libvirt exporter publishes running domains only.
      instant('mlinfra_vm_state{job="node"}'),
      instant(`libvirt_domain_info_virtual_cpus{${LV}}`),
      instant(`libvirt_domain_info_memory_usage_bytes{${LV}}`),
      instant(`up{job="node",role!="hypervisor"}`),
      // Percent of the VM's own vCPUs, so 100 % means "all its vCPUs busy" whatever their number.
      range(`100 * sum by (host, domain) (rate(libvirt_domain_info_cpu_time_seconds_total{${LV}}[${win.rate}]))`
        + ` / sum by (host, domain) (libvirt_domain_info_virtual_cpus{${LV}})`, win),
      range(perDomain('libvirt_domain_block_stats_read_bytes_total'), win),
      range(perDomain('libvirt_domain_block_stats_write_bytes_total'), win),
      range(perDomain('libvirt_domain_interface_stats_receive_bytes_total'), win),
      range(perDomain('libvirt_domain_interface_stats_transmit_bytes_total'), win),
    ]);
    const key = (l) => (l.host || l.instance) + '/' + l.domain;
    const maps = [vcpus, memory, cpu, rd, wr, rx, tx].map((r) => byKey(r, key));
    const agents = byKey(nodeUp, (l) => l.host || l.instance);
    const vms = [];
    const seen = new Set();
    for (const s of states) {
      const k = key(s.labels);
      if (seen.has(k)) continue;
      seen.add(k);
      const name = s.labels.domain;
      vms.push({
        key: k, name, hypervisor: s.labels.host || s.labels.instance, state: s.value,
        vcpus: (maps[0].get(k) || {}).value, memory: (maps[1].get(k) || {}).value,
        cpu: maps[2].get(k), read: maps[3].get(k), write: maps[4].get(k), rx: maps[5].get(k), tx: maps[6].get(k),
        agent: agents.get(name),
      });
    }
    // Defined but not running (shut off, crashed...): no libvirt exporter series to chart.
    for (const s of allStates) {
      const k = key(s.labels);
      if (seen.has(k)) continue;
      seen.add(k);
      vms.push({ key: k, name: s.labels.domain, hypervisor: s.labels.host || s.labels.instance, state: s.value,
        agent: agents.get(s.labels.domain) });
    }
    // VMs whose node exporter is scraped but which no hypervisor's libvirt defines.
    const inLibvirt = new Set(vms.map((v) => v.name));
    for (const [name, agent] of agents) {
      if (!inLibvirt.has(name)) vms.push({ key: 'node/' + name, name, hypervisor: null, state: null, agent });
    }
    for (const vm of vms) vm.maintenance = vm.hypervisor ? maintenance.get(vm.hypervisor) || null : null;
    vms.sort((a, b) => a.name.localeCompare(b.name) || String(a.hypervisor).localeCompare(String(b.hypervisor)));
    return { vms };
  }

  /** A VM only the node job knows has no libvirt series to chart: a note instead of charts.
   *  (Its key differs from a libvirt VM's, so a row never has to switch between the two.) */
  function makeVmRow(vm) {
    const info = h('div', { class: 'vm-info' },
      h('div', { class: 'card-head' }, h('span', { class: 'card-title vm-name' }), h('span', { class: 'badge vm-state' })),
      h('div', { class: 'vm-facts' }),
      h('div', { class: 'vm-agent' }),
      h('div', { class: 'vm-maintenance', hidden: true }));
    const charts = vm.state === null
      ? h('p', { class: 'vm-note muted', text: 'Scraped by the node job, but no scraped hypervisor\'s libvirt defines a '
        + 'domain of this name: it runs elsewhere, or its hypervisor\'s libvirt exporter is not scraped.' })
      : h('div', { class: 'charts charts-3' },
        chartSlot(pctChart('CPU (of its vCPUs)')),
        chartSlot(bytesChart('Disk', fmtRate)),
        chartSlot(bytesChart('Network', fmtRate)));
    return h('article', { class: 'card vm-row' + (vm.state === null ? ' vm-unmanaged' : '') }, info, charts);
  }

  function updateVmRow(row, vm) {
    row.dataset.vm = vm.name;
    setText(row.querySelector('.vm-name'), vm.name);
    const [label, stateKind] = vm.state === null ? ['not in libvirt', 'off']
      : DOMAIN_STATES[vm.state] || ['state ' + vm.state, 'warn'];
    // On a hypervisor in maintenance a VM that is not running is what the playbook does (drained,
    // shut down for the reboot): it reads as expected, never as a failure.
    const expected = Boolean(vm.maintenance) && vm.state !== 1;
    const kind = expected && stateKind === 'bad' ? 'warn' : stateKind;
    setBadge(row.querySelector('.vm-state'), label, kind);
    row.classList.toggle('is-down', kind === 'bad');
    row.classList.toggle('in-maintenance', Boolean(vm.maintenance));
    const note = row.querySelector('.vm-maintenance');
    note.hidden = !vm.maintenance;
    setText(note, !vm.maintenance ? ''
      : (expected ? 'expected: hypervisor in maintenance' : 'hypervisor in maintenance') + ' · ' + fmtMaintenance(vm.maintenance));

    const facts = [];
    if (vm.hypervisor) facts.push('on ' + vm.hypervisor);
    if (isNum(vm.vcpus)) facts.push(vm.vcpus + ' vCPU' + (vm.vcpus === 1 ? '' : 's'));
    if (isNum(vm.memory)) facts.push(fmtBytes(vm.memory));
    setText(row.querySelector('.vm-facts'), facts.join(' · ') || 'no libvirt metrics');

    const agent = row.querySelector('.vm-agent');
    agent.replaceChildren();
    if (vm.agent) {
      const agentUp = vm.agent.value === 1;
      agent.append('node exporter ', badge(agentUp ? 'up' : 'down', agentUp ? 'ok' : expected ? 'warn' : 'bad'));
    } else {
      agent.append(h('span', { class: 'muted', text: 'node exporter not scraped' }));
    }

    const slots = row.querySelectorAll('.chart');
    if (!slots.length) return;
    drawChart(slots[0], [vm.cpu ? { label: 'cpu', values: vm.cpu.values } : emptySeries('cpu')]);
    drawChart(slots[1], [pick(vm.read, 'read'), pick(vm.write, 'write')]);
    drawChart(slots[2], [pick(vm.rx, 'rx'), pick(vm.tx, 'tx')]);
  }

  function pick(result, label) {
    return result ? { label, values: result.values } : emptySeries(label);
  }

  function renderVms(model) {
    const parts = sectionParts('sec-vms');
    setNote(parts, model.vms.length ? '' : 'No VM is known to libvirt or scraped by the node job.', 'muted');
    syncKeyed(parts.list, model.vms, (v) => v.key, makeVmRow, updateVmRow);
    const inLibvirt = model.vms.filter((v) => v.state !== null);
    return {
      vms: inLibvirt.length,
      vmsRunning: inLibvirt.filter((v) => v.state === 1).length,
      vmsUnmanaged: model.vms.length - inLibvirt.length,
    };
  }

  // ------------------------------------------------------------------ section: GPUs

  async function loadGpus(win) {
    const [util, fbUsed, fbFree, temp, power, xid] = await Promise.all([
      range('DCGM_FI_DEV_GPU_UTIL', win),
      range('DCGM_FI_DEV_FB_USED', win),
      range('DCGM_FI_DEV_FB_FREE', win),
      range('DCGM_FI_DEV_GPU_TEMP', win),
      range('DCGM_FI_DEV_POWER_USAGE', win),
      instant('DCGM_FI_DEV_XID_ERRORS'),
    ]);
    // One entity per GPU, or per MIG GPU instance (GPU_I_ID) on a partitioned GPU.
    const key = (l) => [l.host || l.Hostname || l.instance, l.UUID || l.gpu, l.GPU_I_ID || ''].join('/');
    const maps = { util: byKey(util, key), used: byKey(fbUsed, key), free: byKey(fbFree, key),
      temp: byKey(temp, key), power: byKey(power, key), xid: byKey(xid, key) };
    const labelsBy = new Map();
    for (const r of [].concat(fbUsed, util, temp, power, fbFree, xid)) {
      const k = key(r.labels);
      if (!labelsBy.has(k)) labelsBy.set(k, r.labels);
    }
    const gpus = Array.from(labelsBy, ([k, labels]) => ({
      key: k, labels,
      util: maps.util.get(k), used: maps.used.get(k), free: maps.free.get(k),
      temp: maps.temp.get(k), power: maps.power.get(k), xid: (maps.xid.get(k) || {}).value,
    }));
    gpus.sort((a, b) => a.key.localeCompare(b.key, undefined, { numeric: true }));
    return { gpus };
  }

  function makeGpuCard() {
    return h('article', { class: 'card gpu-card' },
      h('div', { class: 'card-head' }, h('span', { class: 'card-title' }), h('span', { class: 'badge gpu-xid' })),
      h('div', { class: 'card-sub gpu-sub' }),
      h('div', { class: 'charts charts-2x2' },
        chartSlot(pctChart('Utilisation')),
        chartSlot(bytesChart('Memory used', fmtBytes, 1048576)),   // DCGM reports MiB
        chartSlot(unitChart('Temperature', '°C', 100)),
        chartSlot(unitChart('Power', 'W', 100))));
  }

  function updateGpuCard(card, gpu) {
    const l = gpu.labels;
    const mig = l.GPU_I_ID !== undefined && l.GPU_I_ID !== '';
    setText(card.querySelector('.card-title'), 'GPU ' + (l.gpu || '?') + (mig ? ' · MIG ' + (l.GPU_I_PROFILE || '') + ' #' + l.GPU_I_ID : ''));
    const xid = card.querySelector('.gpu-xid');
    if (isNum(gpu.xid) && gpu.xid > 0) setBadge(xid, 'last XID ' + gpu.xid, 'bad');
    else setBadge(xid, isNum(gpu.xid) ? 'no XID' : 'XID n/a', isNum(gpu.xid) ? 'ok' : 'off');
    const used = gpu.used ? gpu.used.last : null;
    const free = gpu.free ? gpu.free.last : null;
    const total = isNum(used) && isNum(free) ? used + free : null;
    const sub = card.querySelector('.gpu-sub');
    setText(sub, [l.host || l.Hostname, l.modelName, isNum(total) ? fmtBytes(total * 1048576) + ' memory' : null]
      .filter(Boolean).join(' · '));
    sub.title = l.UUID || '';

    const slots = card.querySelectorAll('.chart');
    slots[1].spec.max = isNum(total) && total > 0 ? total : undefined;
    drawChart(slots[0], [pick(gpu.util, 'util')]);
    drawChart(slots[1], [gpu.used ? { label: 'used', values: gpu.used.values, color: '#d2a8ff' } : emptySeries('used')]);
    drawChart(slots[2], [gpu.temp ? { label: 'temp', values: gpu.temp.values, color: '#f0883e' } : emptySeries('temp')]);
    drawChart(slots[3], [gpu.power ? { label: 'power', values: gpu.power.values, color: '#e3b341' } : emptySeries('power')]);
  }

  function renderGpus(model) {
    const parts = sectionParts('sec-gpus');
    setNote(parts, model.gpus.length ? '' : 'No GPU metrics (no GPU worker is scraped)', 'muted');
    syncKeyed(parts.list, model.gpus, (g) => g.key, makeGpuCard, updateGpuCard);
    return { gpus: model.gpus.length, gpuXid: model.gpus.filter((g) => g.xid > 0).length };
  }

  // ------------------------------------------------------------------ section: alerts

  async function loadAlerts() {
    const data = await promGet('alerts');
    const firing = data.alerts.filter((a) => a.state === 'firing');
    const watchdog = firing.find((a) => a.labels.alertname === 'Watchdog');
    const alerts = firing.filter((a) => a !== watchdog).sort((a, b) =>
      severityRank(a) - severityRank(b) || String(a.activeAt).localeCompare(String(b.activeAt)));
    const pending = data.alerts.filter((a) => a.state === 'pending').length;
    return { alerts, watchdog: Boolean(watchdog), pending };
  }

  function severityRank(alert) {
    const rank = SEVERITY_ORDER[alert.labels.severity];
    return rank === undefined ? 9 : rank;
  }

  function makeAlertRow() {
    return h('div', { class: 'alert-row' },
      h('span', { class: 'badge alert-sev' }), h('span', { class: 'alert-name' }),
      h('span', { class: 'alert-summary' }), h('span', { class: 'alert-where muted' }), h('span', { class: 'alert-since muted' }));
  }

  function updateAlertRow(row, alert) {
    const sev = alert.labels.severity || 'none';
    setBadge(row.querySelector('.alert-sev'), sev, sev === 'critical' || sev === 'error' ? 'bad' : sev === 'warning' ? 'warn' : 'info');
    setText(row.querySelector('.alert-name'), alert.labels.alertname || '(unnamed)');
    const ann = alert.annotations || {};
    setText(row.querySelector('.alert-summary'), ann.summary || ann.description || '');
    setText(row.querySelector('.alert-where'), alert.labels.host || alert.labels.instance || '');
    const since = alert.activeAt ? Date.parse(alert.activeAt) / 1000 : null;
    const el = row.querySelector('.alert-since');
    setText(el, since ? 'since ' + fmtAgo(since) : '');
    el.title = fmtIso(since);
  }

  function renderAlerts(model) {
    const parts = sectionParts('sec-alerts');
    const pending = model.pending ? ' · ' + model.pending + ' pending' : '';
    if (model.alerts.length) setNote(parts, '');
    else setNote(parts, '✓ No alerts firing' + pending, 'ok');
    syncKeyed(parts.list, model.alerts, (a) => JSON.stringify(a.labels), makeAlertRow, updateAlertRow);
    // Watchdog always fires while rule evaluation works; its absence is the thing to notice.
    const section = document.getElementById('sec-alerts');
    let pulse = section.querySelector('.watchdog');
    if (!pulse) {
      pulse = h('span', { class: 'watchdog' });
      section.appendChild(pulse);
    }
    setText(pulse, model.watchdog ? '● alert pipeline alive' : '○ no Watchdog alert: is the alert pipeline running?');
    pulse.className = 'watchdog ' + (model.watchdog ? 'watchdog-ok' : 'watchdog-missing');
    pulse.title = model.watchdog ? 'The always-firing Watchdog alert is present' : 'The always-firing Watchdog alert is not firing';
    return { alerts: model.alerts.length };
  }

  // ------------------------------------------------------------------ section: pipeline stages

  async function loadStages() {
    const [ts, success, duration, skipped, lastOk] = await Promise.all([
      instant('mlinfra_stage_last_run_timestamp_seconds'),
      instant('mlinfra_stage_last_run_success'),
      instant('mlinfra_stage_last_run_duration_seconds'),
      instant('mlinfra_stage_skipped_total'),
      instant('mlinfra_stage_last_success_timestamp_seconds'),
    ]);
    // Not keyed by mlflow_run_id: only the last_run_* series carry it.
    const key = (l) => [l.pipeline || '', l.stage || '', stageHost(l)].join('\u0000');
    const maps = {
      ts: byKey(ts, key), success: byKey(success, key), duration: byKey(duration, key),
      skipped: byKey(skipped, key), lastOk: byKey(lastOk, key),
    };
    const keys = new Set([].concat(ts, success, duration, skipped).map((r) => key(r.labels)));
    const stages = Array.from(keys, (k) => {
      const any = maps.ts.get(k) || maps.success.get(k) || maps.duration.get(k) || maps.skipped.get(k);
      const runId = [maps.ts, maps.success, maps.duration]
        .map((m) => (m.get(k) ? m.get(k).labels.mlflow_run_id : '')).find((id) => id) || '';
      return {
        key: k, stage: any.labels.stage || '?', pipeline: any.labels.pipeline || '', host: stageHost(any.labels),
        ts: (maps.ts.get(k) || {}).value, success: (maps.success.get(k) || {}).value,
        duration: (maps.duration.get(k) || {}).value, skipped: (maps.skipped.get(k) || {}).value, runId,
        lastOk: (maps.lastOk.get(k) || {}).value,
      };
    });
    stages.sort((a, b) => (b.ts || 0) - (a.ts || 0) || a.stage.localeCompare(b.stage));
    return { stages };
  }

  /** The textfile's own host label is renamed exported_host when the target also sets host. */
  function stageHost(labels) {
    return labels.exported_host || labels.host || labels.instance || '';
  }

  /** The MLflow UI's direct run route (#/runs/<id>) resolves the experiment by itself. */
  function mlflowRunUrl(runId) {
    const base = mlflowBase();
    return base && runId ? base + '/#/runs/' + encodeURIComponent(runId) : null;
  }

  function mlflowBase() {
    try {
      const url = new URL(state.config.mlflow_url);
      // Only http(s): a config value must never become a javascript: link.
      return url.protocol === 'http:' || url.protocol === 'https:' ? url.href.replace(/\/+$/, '') : null;
    } catch (err) {
      return null;
    }
  }

  function makeStageRow() {
    return h('tr', null,
      h('td', null, h('span', { class: 'badge stage-result' }), h('span', { class: 'stage-last-ok muted' })),
      h('td', { class: 'stage-name' }), h('td', { class: 'stage-pipeline muted' }), h('td', { class: 'stage-host' }),
      h('td', { class: 'stage-when' }), h('td', { class: 'num stage-duration' }), h('td', { class: 'num stage-skipped' }),
      h('td', { class: 'stage-run' }));
  }

  function updateStageRow(row, s) {
    const result = s.success === 1 ? 'succeeded' : s.success === 0 ? 'failed' : 'unknown';
    row.dataset.stage = s.stage;
    row.dataset.result = result;
    row.className = 'stage-' + result;
    setBadge(row.querySelector('.stage-result'), s.success === 1 ? '✓ succeeded' : s.success === 0 ? '✗ failed' : '? unknown',
      s.success === 1 ? 'ok' : s.success === 0 ? 'bad' : 'off');
    // For a failing stage, how long it has been broken is the next question.
    const lastOk = row.querySelector('.stage-last-ok');
    setText(lastOk, s.success === 0 && isNum(s.lastOk) ? 'last success ' + fmtAgo(s.lastOk) : '');
    lastOk.title = fmtIso(s.lastOk);
    setText(row.querySelector('.stage-name'), s.stage);
    setText(row.querySelector('.stage-pipeline'), s.pipeline);
    setText(row.querySelector('.stage-host'), s.host);
    const when = row.querySelector('.stage-when');
    setText(when, fmtAgo(s.ts));
    when.title = fmtIso(s.ts);
    setText(row.querySelector('.stage-duration'), fmtDuration(s.duration));
    setText(row.querySelector('.stage-skipped'), isNum(s.skipped) ? String(Math.round(s.skipped)) : '–');

    const cell = row.querySelector('.stage-run');
    const url = mlflowRunUrl(s.runId);
    const shown = cell.dataset.shown === (url || '') + '|' + s.runId;
    if (!shown) {
      cell.dataset.shown = (url || '') + '|' + s.runId;
      const short = s.runId.slice(0, 8);
      cell.replaceChildren(url
        ? h('a', { href: url, target: '_blank', rel: 'noopener', title: 'MLflow run ' + s.runId, text: short + ' ↗' })
        : h('span', { class: 'muted', title: s.runId, text: s.runId ? short : '–' }));
    }
  }

  function renderStages(model) {
    const parts = sectionParts('sec-stages');
    setNote(parts, model.stages.length ? '' : 'No pipeline stage has reported yet (mlinfra_stage_* metrics).', 'muted');
    let table = parts.list.querySelector('table');
    if (!table) {
      table = h('table', { class: 'stages' },
        h('thead', null, h('tr', null, ['Result', 'Stage', 'Pipeline', 'Host', 'When', 'Duration', 'Skipped', 'MLflow run']
          .map((t, i) => h('th', { class: i === 5 || i === 6 ? 'num' : null, text: t })))),
        h('tbody'));
      parts.list.appendChild(table);
    }
    table.hidden = !model.stages.length;
    syncKeyed(table.tBodies[0], model.stages, (s) => s.key, makeStageRow, updateStageRow);
    return { stagesFailed: model.stages.filter((s) => s.success === 0).length, stages: model.stages.length };
  }

  // ------------------------------------------------------------------ section: Slurm

  /**
   * The Slurm collector's series (files/mlinfra_slurm_state.py on the slurmctld host): the
   * queue per partition with the pending reasons, node states with drain reasons, GPU-hours per
   * account. The section stays hidden while no collector reports (no mlinfra_slurm_up series).
   */
  async function loadSlurm() {
    const [up, jobs, oldest, gpus, gpusAlloc, nodes, hours, windowSeconds] = await Promise.all([
      instant('mlinfra_slurm_up'),
      instant('mlinfra_slurm_jobs'),
      instant('mlinfra_slurm_pending_oldest_seconds'),
      instant('mlinfra_slurm_partition_gpus'),
      instant('mlinfra_slurm_partition_gpus_allocated'),
      instant('mlinfra_slurm_node_state'),
      instant('mlinfra_slurm_account_gpu_hours'),
      instant('mlinfra_slurm_gpu_usage_window_seconds'),
    ]);
    const daemons = {};
    for (const r of up) daemons[r.labels.daemon] = r.value;
    const partitions = new Map();
    const partition = (name) => {
      if (!partitions.has(name)) {
        partitions.set(name, { name, running: 0, pending: 0, reasons: new Map(), oldest: null, gpus: null, gpusAlloc: null });
      }
      return partitions.get(name);
    };
    for (const r of jobs) {
      const p = partition(r.labels.partition || '');
      const n = isNum(r.value) ? r.value : 0;
      if (r.labels.state === 'RUNNING') p.running += n;
      else if (r.labels.state === 'PENDING') {
        p.pending += n;
        const reason = r.labels.reason || '?';
        p.reasons.set(reason, (p.reasons.get(reason) || 0) + n);
      }
    }
    for (const r of oldest) {
      const p = partition(r.labels.partition || '');
      if (isNum(r.value) && (p.oldest === null || r.value > p.oldest)) p.oldest = r.value;
    }
    for (const r of gpus) partition(r.labels.partition || '').gpus = r.value;
    for (const r of gpusAlloc) partition(r.labels.partition || '').gpusAlloc = r.value;
    const byName = (a, b) => a.name.localeCompare(b.name, undefined, { numeric: true });
    return {
      present: up.length > 0,
      daemons,
      partitions: Array.from(partitions.values()).sort(byName),
      nodes: nodes.map((r) => ({ name: r.labels.node || '?', state: r.labels.state || '?', reason: r.labels.reason || '' }))
        .sort(byName),
      accounts: hours.map((r) => ({ name: r.labels.account || '?', hours: r.value }))
        .sort((a, b) => (b.hours || 0) - (a.hours || 0) || a.name.localeCompare(b.name)),
      windowSeconds: windowSeconds.length ? windowSeconds[0].value : null,
    };
  }

  const SLURM_NODE_KIND = {
    idle: 'ok', mixed: 'info', allocated: 'info', completing: 'info',
    drained: 'warn', draining: 'warn', down: 'bad', error: 'bad', unknown: 'off', future: 'off',
  };

  function slurmTable(cls, headings, numeric) {
    return h('table', { class: 'stages slurm-table ' + cls },
      h('thead', null, h('tr', null, headings.map((t, i) => h('th', { class: numeric.includes(i) ? 'num' : null, text: t })))),
      h('tbody'));
  }

  function slurmBlock(list, cls, title, table) {
    let block = list.querySelector('.' + cls);
    if (!block) {
      block = h('div', { class: 'slurm-block ' + cls }, h('h3', { text: title }), h('p', { class: 'note muted', hidden: true }), table);
      list.appendChild(block);
    }
    return block;
  }

  function makeQueueRow() {
    return h('tr', null, h('td', { class: 'stage-name slurm-partition' }), h('td', { class: 'num slurm-running' }),
      h('td', { class: 'num slurm-pending' }), h('td', { class: 'slurm-reasons' }), h('td', { class: 'num slurm-oldest' }),
      h('td', { class: 'num slurm-gpus' }));
  }

  function updateQueueRow(row, p) {
    row.dataset.partition = p.name;
    setText(row.querySelector('.slurm-partition'), p.name || '–');
    setText(row.querySelector('.slurm-running'), String(p.running));
    setText(row.querySelector('.slurm-pending'), String(p.pending));
    setText(row.querySelector('.slurm-reasons'), Array.from(p.reasons, ([reason, n]) => reason + ' ' + n).join(', ') || '–');
    setText(row.querySelector('.slurm-oldest'), p.pending ? fmtDuration(p.oldest) : '–');
    setText(row.querySelector('.slurm-gpus'), isNum(p.gpus) ? fmtNum(p.gpusAlloc || 0, 0) + ' / ' + fmtNum(p.gpus, 0) : '–');
  }

  function makeNodeRow() {
    return h('tr', null, h('td', { class: 'stage-name slurm-node' }), h('td', null, h('span', { class: 'badge slurm-state' })),
      h('td', { class: 'slurm-reason' }));
  }

  function updateNodeRow(row, n) {
    row.dataset.node = n.name;
    row.dataset.state = n.state;
    setText(row.querySelector('.slurm-node'), n.name);
    setBadge(row.querySelector('.slurm-state'), n.state, SLURM_NODE_KIND[n.state] || 'off');
    setText(row.querySelector('.slurm-reason'), n.reason || '');
  }

  function makeAccountRow() {
    return h('tr', null, h('td', { class: 'stage-name slurm-account' }), h('td', { class: 'num slurm-hours' }));
  }

  function updateAccountRow(row, a) {
    row.dataset.account = a.name;
    setText(row.querySelector('.slurm-account'), a.name);
    setText(row.querySelector('.slurm-hours'), fmtNum(a.hours, 1));
  }

  function renderSlurm(model) {
    const section = document.getElementById('sec-slurm');
    section.hidden = !model.present;
    if (!model.present) return {};
    const parts = sectionParts('sec-slurm');
    let daemons = section.querySelector('.slurm-daemons');
    if (!daemons) {
      daemons = h('span', { class: 'slurm-daemons' },
        h('span', { class: 'badge slurm-daemon', dataset: { daemon: 'slurmctld' } }),
        h('span', { class: 'badge slurm-daemon', dataset: { daemon: 'slurmdbd' } }));
      section.querySelector('h2').appendChild(daemons);
    }
    for (const badgeNode of daemons.children) {
      const name = badgeNode.dataset.daemon;
      const value = model.daemons[name];
      setBadge(badgeNode, name + (value === 1 ? ' up' : value === 0 ? ' down' : ' ?'), value === 1 ? 'ok' : value === 0 ? 'bad' : 'off');
    }
    setNote(parts, model.daemons.slurmctld === 0 ? 'slurmctld does not answer: queue and nodes unknown' : '', 'muted');

    const queue = slurmBlock(parts.list, 'slurm-queue', 'Queue',
      slurmTable('', ['Partition', 'Running', 'Pending', 'Pending reasons', 'Oldest pending', 'GPUs used'], [1, 2, 4, 5]));
    syncKeyed(queue.querySelector('tbody'), model.partitions, (p) => p.name, makeQueueRow, updateQueueRow);
    const nodes = slurmBlock(parts.list, 'slurm-nodes', 'Nodes', slurmTable('', ['Node', 'State', 'Reason'], []));
    syncKeyed(nodes.querySelector('tbody'), model.nodes, (n) => n.name, makeNodeRow, updateNodeRow);
    const days = isNum(model.windowSeconds) ? Math.round(model.windowSeconds / 86400) : null;
    const accounts = slurmBlock(parts.list, 'slurm-accounts', 'GPU-hours per account',
      slurmTable('', ['Account', 'GPU-hours'], [1]));
    setText(accounts.querySelector('h3'), 'GPU-hours per account' + (days ? ' · last ' + days + ' d' : ''));
    syncKeyed(accounts.querySelector('tbody'), model.accounts, (a) => a.name, makeAccountRow, updateAccountRow);
    const noAccounts = accounts.querySelector('.note');
    noAccounts.hidden = model.accounts.length > 0;
    setText(noAccounts, model.daemons.slurmdbd === 0 ? 'slurmdbd does not answer' : 'No GPU job in the window');

    const pending = model.partitions.reduce((n, p) => n + p.pending, 0);
    const running = model.partitions.reduce((n, p) => n + p.running, 0);
    const out = model.nodes.filter((n) => ['drained', 'draining', 'down', 'error'].includes(n.state)).length;
    return { slurmRunning: running, slurmPending: pending, slurmNodesOut: out,
      slurmDown: model.daemons.slurmctld === 0 || model.daemons.slurmdbd === 0 };
  }

  // ------------------------------------------------------------------ section: cost

  /**
   * The cost of the pipelines' train runs (mlinfra_run_cost.prom, written by the pipeline role
   * on its first worker after each priced run): the last run per pipeline from its gauges, and
   * per day and per account from increase() of the running totals. increase() sees a counter
   * rise only between two scrapes, so a label set's very first priced run is in the per-run
   * table but not in the per-day and per-account figures. Hidden while no run was priced (no
   * mlinfra_runs_priced_total series).
   */
  const COST_DAYS = 7;
  const COST_ACCOUNT_WINDOW = '30d';

  async function loadCost() {
    const perDay = [];
    for (let day = 0; day < COST_DAYS; day += 1) {
      const offset = day ? ' offset ' + day + 'd' : '';
      perDay.push(instant('sum by (currency, kind) (increase(mlinfra_run_cost_total{kind=~"on_premise|cloud"}[1d]'
        + offset + '))'));
    }
    const win = COST_ACCOUNT_WINDOW;
    const [priced, last, hours, breakEven, stamps, acctOnPrem, acctCloud, acctHours, acctRuns, ...days] = await Promise.all([
      instant('mlinfra_runs_priced_total'),
      instant('mlinfra_run_cost_last'),
      instant('mlinfra_run_gpu_hours_last'),
      instant('mlinfra_run_break_even_utilisation'),
      instant('mlinfra_run_last_timestamp_seconds'),
      instant(`sum by (account, currency) (increase(mlinfra_run_cost_total{kind="on_premise"}[${win}]))`),
      instant(`sum by (account, currency) (increase(mlinfra_run_cost_total{kind="cloud"}[${win}]))`),
      instant(`sum by (account) (increase(mlinfra_run_gpu_hours_total[${win}]))`),
      instant(`sum by (account) (increase(mlinfra_runs_priced_total[${win}]))`),
      ...perDay,
    ]);
    // One run per pipeline and host (the file is per first worker); the account is the run's.
    const host = (l) => stageHost(l);
    const runKey = (l) => [l.pipeline || '', l.account || '', host(l)].join('\u0000');
    const runs = new Map();
    for (const r of hours) {
      runs.set(runKey(r.labels), {
        key: runKey(r.labels), pipeline: r.labels.pipeline || '?', account: r.labels.account || '-', host: host(r.labels),
        hours: r.value, onPremise: null, cloud: null, currency: '', breakEven: null, ts: null, runId: '',
      });
    }
    for (const r of last) {
      const run = runs.get(runKey(r.labels));
      if (!run) continue;
      run.currency = r.labels.currency || run.currency;
      if (r.labels.kind === 'on_premise') run.onPremise = r.value;
      else if (r.labels.kind === 'cloud') run.cloud = r.value;
    }
    for (const r of stamps) {
      const run = runs.get(runKey(r.labels));
      if (run) Object.assign(run, { ts: r.value, runId: r.labels.mlflow_run_id || '' });
    }
    for (const r of breakEven) {
      for (const run of runs.values()) {
        if (run.pipeline === (r.labels.pipeline || '?') && run.host === host(r.labels)) run.breakEven = r.value;
      }
    }

    const accounts = new Map();
    const account = (l) => {
      const key = (l.account || '-') + '\u0000' + (l.currency || '');
      if (!accounts.has(key)) accounts.set(key, { key, name: l.account || '-', currency: l.currency || '', onPremise: null, cloud: null });
      return accounts.get(key);
    };
    for (const r of acctOnPrem) account(r.labels).onPremise = r.value;
    for (const r of acctCloud) account(r.labels).cloud = r.value;
    const hoursOf = new Map(acctHours.map((r) => [r.labels.account || '-', r.value]));
    const runsOf = new Map(acctRuns.map((r) => [r.labels.account || '-', r.value]));
    for (const a of accounts.values()) Object.assign(a, { hours: hoursOf.get(a.name), runs: runsOf.get(a.name) });

    const perDayRows = [];
    days.forEach((result, day) => {
      const byCurrency = new Map();
      for (const r of result) {
        const currency = r.labels.currency || '';
        if (!byCurrency.has(currency)) byCurrency.set(currency, { key: day + '\u0000' + currency, day, currency, onPremise: null, cloud: null });
        const row = byCurrency.get(currency);
        if (r.labels.kind === 'on_premise') row.onPremise = r.value;
        else if (r.labels.kind === 'cloud') row.cloud = r.value;
      }
      perDayRows.push(...Array.from(byCurrency.values()).sort((a, b) => a.currency.localeCompare(b.currency)));
    });

    return {
      present: priced.length > 0,
      runs: Array.from(runs.values()).sort((a, b) => (b.ts || 0) - (a.ts || 0) || a.pipeline.localeCompare(b.pipeline)),
      days: perDayRows,
      accounts: Array.from(accounts.values())
        .sort((a, b) => (b.onPremise || 0) - (a.onPremise || 0) || a.name.localeCompare(b.name)),
    };
  }

  function fmtMoney(v, currency) {
    return isNum(v) ? v.toFixed(2) + (currency ? ' ' + currency : '') : '–';
  }

  function makeCostRunRow() {
    return h('tr', null, h('td', { class: 'stage-name cost-pipeline' }), h('td', { class: 'cost-account' }),
      h('td', { class: 'num cost-on-premise' }), h('td', { class: 'num cost-cloud' }), h('td', { class: 'num cost-gpu-hours' }),
      h('td', { class: 'num cost-break-even' }), h('td', { class: 'cost-when' }));
  }

  function updateCostRunRow(row, r) {
    row.dataset.pipeline = r.pipeline;
    row.dataset.account = r.account;
    setText(row.querySelector('.cost-pipeline'), r.pipeline);
    setText(row.querySelector('.cost-account'), r.account);
    setText(row.querySelector('.cost-on-premise'), fmtMoney(r.onPremise, r.currency));
    setText(row.querySelector('.cost-cloud'), fmtMoney(r.cloud, r.currency));
    setText(row.querySelector('.cost-gpu-hours'), fmtNum(r.hours, 2));
    const breakEven = row.querySelector('.cost-break-even');
    setText(breakEven, isNum(r.breakEven) ? fmtPct(r.breakEven * 100) : '–');
    breakEven.title = isNum(r.breakEven) ? 'owning the GPUs is cheaper than the cloud above this utilisation' : 'no cloud rate, or it never breaks even';
    const when = row.querySelector('.cost-when');
    setText(when, fmtAgo(r.ts));
    when.title = fmtIso(r.ts) + (r.runId ? ' · MLflow run ' + r.runId : '') + (r.host ? ' · ' + r.host : '');
  }

  function makeCostDayRow() {
    return h('tr', null, h('td', { class: 'stage-name cost-day' }), h('td', { class: 'num cost-day-on-premise' }),
      h('td', { class: 'num cost-day-cloud' }));
  }

  function updateCostDayRow(row, d) {
    row.dataset.day = String(d.day);
    row.dataset.currency = d.currency;
    setText(row.querySelector('.cost-day'), d.day === 0 ? 'last 24 h' : d.day === 1 ? 'the 24 h before' : d.day + ' d ago');
    setText(row.querySelector('.cost-day-on-premise'), fmtMoney(d.onPremise, d.currency));
    setText(row.querySelector('.cost-day-cloud'), fmtMoney(d.cloud, d.currency));
  }

  function makeCostAccountRow() {
    return h('tr', null, h('td', { class: 'stage-name cost-account' }), h('td', { class: 'num cost-acct-on-premise' }),
      h('td', { class: 'num cost-acct-cloud' }), h('td', { class: 'num cost-acct-gpu-hours' }), h('td', { class: 'num cost-acct-runs' }));
  }

  function updateCostAccountRow(row, a) {
    row.dataset.account = a.name;
    row.dataset.currency = a.currency;
    setText(row.querySelector('.cost-account'), a.name);
    setText(row.querySelector('.cost-acct-on-premise'), fmtMoney(a.onPremise, a.currency));
    setText(row.querySelector('.cost-acct-cloud'), fmtMoney(a.cloud, a.currency));
    setText(row.querySelector('.cost-acct-gpu-hours'), fmtNum(a.hours, 2));
    setText(row.querySelector('.cost-acct-runs'), isNum(a.runs) ? String(Math.round(a.runs)) : '–');
  }

  function renderCost(model) {
    const section = document.getElementById('sec-cost');
    section.hidden = !model.present;
    if (!model.present) return {};
    const parts = sectionParts('sec-cost');
    setNote(parts, '', null);
    const runs = slurmBlock(parts.list, 'cost-runs', 'Last run per pipeline',
      slurmTable('cost-table', ['Pipeline', 'Account', 'On premise', 'Cloud', 'GPU-hours', 'Break-even', 'When'], [2, 3, 4, 5]));
    syncKeyed(runs.querySelector('tbody'), model.runs, (r) => r.key, makeCostRunRow, updateCostRunRow);
    const days = slurmBlock(parts.list, 'cost-days', 'Per day', slurmTable('cost-table', ['Day', 'On premise', 'Cloud'], [1, 2]));
    syncKeyed(days.querySelector('tbody'), model.days, (d) => d.key, makeCostDayRow, updateCostDayRow);
    const noDays = days.querySelector('.note');
    noDays.hidden = model.days.length > 0;
    setText(noDays, 'No priced run in the last ' + COST_DAYS + ' days');
    const accounts = slurmBlock(parts.list, 'cost-accounts', 'Per account · last 30 d',
      slurmTable('cost-table', ['Account', 'On premise', 'Cloud', 'GPU-hours', 'Runs'], [1, 2, 3, 4]));
    syncKeyed(accounts.querySelector('tbody'), model.accounts, (a) => a.key, makeCostAccountRow, updateCostAccountRow);
    const noAccounts = accounts.querySelector('.note');
    noAccounts.hidden = model.accounts.length > 0;
    setText(noAccounts, 'No priced run in the last 30 days');
    return {};
  }

  // ------------------------------------------------------------------ refresh loop

  const SECTIONS = [
    { id: 'sec-alerts', load: loadAlerts, render: renderAlerts },
    { id: 'sec-hypervisors', load: loadHypervisors, render: renderHypervisors },
    { id: 'sec-vms', load: loadVms, render: renderVms },
    { id: 'sec-gpus', load: loadGpus, render: renderGpus },
    { id: 'sec-stages', load: loadStages, render: renderStages },
    { id: 'sec-slurm', load: loadSlurm, render: renderSlurm },
    { id: 'sec-cost', load: loadCost, render: renderCost },
  ];

  function setSectionError(id, message) {
    const section = document.getElementById(id);
    let box = section.querySelector('.section-error');
    if (!message) {
      if (box) box.remove();
      return;
    }
    if (!box) {
      box = h('p', { class: 'section-error' });
      section.querySelector('h2').after(box);
    }
    setText(box, message);
  }

  async function refresh() {
    const win = timeWindow();
    const results = await Promise.allSettled(SECTIONS.map((s) => s.load(win)));
    // Draw only after every load finished: charts read state.window for their x range.
    state.window = win;
    let unreachable = null;
    const summary = {};
    results.forEach((result, i) => {
      const section = SECTIONS[i];
      if (result.status === 'rejected') {
        if (result.reason instanceof PromError && result.reason.unreachable) unreachable = result.reason;
        else setSectionError(section.id, 'Query failed: ' + result.reason.message);
        return;
      }
      try {
        Object.assign(summary, section.render(result.value));
        setSectionError(section.id, null);
      } catch (err) {
        console.error('rendering', section.id, err);   // a bug: let it show in the console too
        setSectionError(section.id, 'Display error: ' + err.message);
      }
    });
    if (unreachable) {
      showUnreachable(unreachable);
    } else {
      state.lastSuccess = new Date();
      hideBanner();
      renderSummary(summary);
    }
    updateHeader(Boolean(unreachable));
  }

  function showUnreachable(err) {
    const banner = document.getElementById('error-banner');
    const since = state.lastSuccess ? 'Showing data from ' + fmtClock(state.lastSuccess) + '.' : 'No data loaded yet.';
    setText(banner, '⚠ Prometheus cannot be reached: ' + err.message + '. ' + since
      + ' Retrying every ' + state.config.refresh_seconds + ' s.');
    banner.hidden = false;
    document.body.classList.add('stale');
  }

  function hideBanner() {
    document.getElementById('error-banner').hidden = true;
    document.body.classList.remove('stale');
  }

  function updateHeader(failed) {
    const dot = document.getElementById('status-dot');
    dot.className = 'dot ' + (failed ? 'dot-bad' : 'dot-ok');
    setText(document.getElementById('last-refresh'), state.lastSuccess
      ? 'updated ' + fmtClock(state.lastSuccess) : 'not updated yet');
  }

  /** One line of counts in the header: what needs attention, at a glance. */
  function renderSummary(s) {
    const bar = document.querySelector('.topbar');
    let line = bar.querySelector('.summary');
    if (!line) {
      line = h('div', { class: 'summary' });
      bar.querySelector('h1').after(line);
    }
    const plural = (n, word) => n + ' ' + word + (n === 1 ? '' : 's');
    const chips = [];
    const chip = (text, kind, title) => chips.push(h('span', { class: 'chip chip-' + kind, text, title }));
    // A section whose query failed reports nothing: its chip is left out rather than wrong.
    if ('hypervisors' in s) {
      chip(plural(s.hypervisors, 'hypervisor') + (s.hypervisorsDown ? ', ' + s.hypervisorsDown + ' down' : '')
        + (s.hypervisorsMaintenance ? ', ' + s.hypervisorsMaintenance + ' in maintenance' : ''),
        s.hypervisorsDown ? 'bad' : s.hypervisorsMaintenance ? 'warn' : 'ok');
    }
    if ('vms' in s) {
      chip(s.vmsRunning + '/' + s.vms + ' VMs running' + (s.vmsUnmanaged ? ', +' + s.vmsUnmanaged + ' not defined in a scraped libvirt' : ''),
        s.vmsRunning === s.vms ? 'ok' : 'warn',
        s.vmsUnmanaged ? plural(s.vmsUnmanaged, 'VM') + ' scraped by the node job but defined in no scraped libvirt' : null);
    }
    if ('gpus' in s) chip(plural(s.gpus, 'GPU') + (s.gpuXid ? ', ' + s.gpuXid + ' with XID' : ''), s.gpuXid ? 'bad' : 'neutral');
    if ('alerts' in s) chip(plural(s.alerts, 'alert') + ' firing', s.alerts ? 'bad' : 'ok');
    if ('stages' in s) chip(s.stagesFailed + '/' + s.stages + ' stages failed', s.stagesFailed ? 'bad' : 'ok');
    if ('slurmRunning' in s) {
      chip('Slurm: ' + s.slurmRunning + ' running, ' + s.slurmPending + ' pending'
        + (s.slurmNodesOut ? ', ' + plural(s.slurmNodesOut, 'node') + ' out' : '') + (s.slurmDown ? ', a daemon down' : ''),
        s.slurmDown ? 'bad' : s.slurmNodesOut ? 'warn' : 'neutral');
    }
    line.replaceChildren(...chips);
  }

  function schedule() {
    clearTimeout(state.timer);
    state.timer = setTimeout(async () => {
      await refresh();
      schedule();
    }, state.config.refresh_seconds * 1000);
  }

  // ------------------------------------------------------------------ start-up

  /** config.json is written by the role; without it (or with a broken one) the defaults apply. */
  async function loadConfig() {
    let loaded = {};
    try {
      const response = await fetch('config.json', { cache: 'no-store' });
      if (response.ok) loaded = await response.json();
    } catch (err) {
      loaded = {};
    }
    const cfg = Object.assign({}, DEFAULTS);
    if (typeof loaded.title === 'string' && loaded.title.trim()) cfg.title = loaded.title.trim();
    if (typeof loaded.mlflow_url === 'string') cfg.mlflow_url = loaded.mlflow_url.trim();
    cfg.refresh_seconds = numberIn(loaded.refresh_seconds, DEFAULTS.refresh_seconds, 5, 3600);
    cfg.range_minutes = numberIn(loaded.range_minutes, DEFAULTS.range_minutes, 1, 7 * 24 * 60);
    cfg.scrape_interval_seconds = numberIn(loaded.scrape_interval_seconds, DEFAULTS.scrape_interval_seconds, 1, 600);
    return cfg;
  }

  /** A config number (or numeric string) kept within [lo, hi]; anything else -> fallback. */
  function numberIn(value, fallback, lo, hi) {
    const v = typeof value === 'string' && value.trim() ? Number(value) : value;
    return isNum(v) ? clamp(v, lo, hi) : fallback;
  }

  function clamp(v, lo, hi) {
    return Math.min(hi, Math.max(lo, v));
  }

  function applyConfig(cfg) {
    state.config = cfg;
    document.title = cfg.title;
    setText(document.getElementById('title'), cfg.title);
    setText(document.getElementById('refresh-info'),
      'last ' + fmtSpan(cfg.range_minutes) + ' · every ' + cfg.refresh_seconds + ' s');
    const link = document.getElementById('mlflow-link');
    const base = mlflowBase();
    link.hidden = !base;
    if (base) link.href = base + '/';
  }

  async function start() {
    if (typeof uPlot === 'undefined') {
      const banner = document.getElementById('error-banner');
      setText(banner, 'The chart library (vendor/uPlot.iife.min.js) is missing: run scripts/build-dashboard-vendor.sh before deploying.');
      banner.hidden = false;
      return;
    }
    applyConfig(await loadConfig());
    await refresh();
    schedule();
  }

  // For debugging in the console and for the browser test.
  window.mlinfraDashboard = { state, refresh };
  start();
}());
