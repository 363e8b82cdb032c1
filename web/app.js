// The page: inputs -> settings -> the library's verbs (WebAssembly) -> the
// DOM. Every figure shown carries its source verb and JSON key
// (data-src, data-key) and its exact value (data-value), as
// `memledger VERB --format json` prints it; tests/web/page_test.py holds the
// two against each other.
'use strict';

// input id -> the library's key (ml_config_set / ml_job_set), in the order
// the command line applies its flags
const FIELDS = [
  ['micro_batch', 'training.micro_batch'], ['seq_len', 'training.seq_len'],
  ['grad_accum', 'training.grad_accum'], ['precision', 'training.precision'],
  ['optimizer', 'training.optimizer'], ['checkpoint', 'training.checkpoint'],
  ['engine', 'training.engine'],
  ['tp', 'parallel.tp'], ['cp', 'parallel.cp'], ['ep', 'parallel.ep'], ['etp', 'parallel.etp'],
  ['expert_capacity', 'training.expert_capacity'], ['expert_pad', 'training.expert_pad'],
  ['pp', 'parallel.pp'],
  ['vpp', 'parallel.vpp'],
  ['dp', 'training.data_parallel'], ['dp_shard', 'parallel.dp_shard'],
  ['dist_optimizer', 'parallel.dist_optimizer'],
  ['zero', 'training.zero'], ['device', 'device.memory'], ['allocator', 'device.allocator'],
  ['interconnect', 'device.interconnect_gbps'], ['attention', 'attention'],
];
// the layout search's own inputs (fit --gpus's flags)
const SEARCH = [['gpus', 'gpus'], ['global_batch', 'global_batch'],
                ['gpus_per_node', 'gpus_per_node'], ['network', 'network']];
// what the search chooses itself, not passed to it
const SEARCHED = new Set(['training.micro_batch', 'training.grad_accum', 'training.checkpoint',
                          'parallel.tp', 'parallel.cp', 'parallel.ep', 'parallel.pp',
                          'parallel.vpp',
                          'training.data_parallel',
                          'training.zero', 'parallel.dp_shard', 'parallel.dist_optimizer']);
const PRESETS = window.MEMLEDGER_PRESETS || {};
const $ = (id) => document.getElementById(id);
let M = null;          // the WebAssembly module
let custom = null;     // {text, hf, name}: a pasted or dropped model
let pending = 0;

function run(verb, model, settings) {
  const p = M.ccall('mlw_run', 'number', ['string', 'string', 'number', 'string', 'string'],
                    [verb, model.text, model.hf ? 1 : 0, model.name, settings]);
  const s = M.UTF8ToString(p);
  M.ccall('mlw_free', null, ['number'], [p]);
  return s[0] === '0' ? {ok: true, text: s.slice(1)} : {ok: false, error: JSON.parse(s.slice(1))};
}

// binary units, as the command line prints them
function bytes(n) {
  if (n === null || n === undefined) return '–';
  const units = ['KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  let v = Math.abs(n), u = -1;
  while (v >= 1024 && u < units.length - 1) { v /= 1024; u++; }
  const sign = n < 0 ? '-' : '';
  return u < 0 ? sign + v + ' B' : sign + v.toFixed(2) + ' ' + units[u];
}

function seconds(s) { return s === null || s === undefined ? '–' : s.toPrecision(4) + ' s'; }

function modelNow() {
  if (custom) return custom;
  const name = $('preset').value;
  return {text: PRESETS[name], hf: name.endsWith('.json'), name: name};
}

function settingsFor(verb) {
  const lines = [];
  for (const [id, key] of FIELDS) {
    const v = $(id).value.trim();
    if (!v) continue;
    if (verb === 'compare' && key === 'training.checkpoint') continue; // compare plans each
    if (verb === 'fit' && key === 'training.micro_batch') continue;    // fit searches it
    if (verb === 'layouts' && SEARCHED.has(key)) continue;
    lines.push(key + '=' + v);
  }
  if (verb === 'layouts') {
    for (const [id, key] of SEARCH) {
      const v = $(id).value.trim();
      if (v) lines.push(key + '=' + v);
    }
  }
  return lines.join('\n');
}

function showLayouts(r) {
  // the CLI's names: tp2.cp2.pp4[7..7].dp8.ep8
  const name = (w) => 'tp' + w.tp + (w.cp > 1 ? '.cp' + w.cp : '') + '.pp' + w.pp +
                      (w.first_layers ? '[' + w.first_layers + '..' + w.last_layers + ']' : '') +
                      (w.vpp > 1 ? '.vpp' + w.vpp : '') + '.dp' + w.dp +
                      (w.ep > 1 ? '.ep' + w.ep : '');
  const shard = (w) => (w.dist_optimizer ? 'dist-opt' : w.dp * Math.max(w.cp, 1) <= 1 ? '–'
                        : ['ddp', 'zero1', 'zero2', 'zero3'][w.zero]);
  $('layouts-note').textContent = r.note;
  table($('layouts'), ['layout', 'micro × m', 'checkpoint', 'sharding', 'peak', 'device total',
                       'step', 'tokens/s', 'MFU'],
        r.layouts.map((w, i) => [name(w), w.micro_batch + ' × ' + w.micro_batches, w.checkpoint,
                                 shard(w),
                                 cell(bytes(w.peak), 'layouts', 'layouts.' + i + '.peak', w.peak),
                                 cell(bytes(w.device_total), 'layouts',
                                      'layouts.' + i + '.device_total', w.device_total),
                                 cell(seconds(w.step_s), 'layouts', 'layouts.' + i + '.step_s',
                                      w.step_s),
                                 cell(w.tokens_per_s === null ? '–' : w.tokens_per_s.toPrecision(4),
                                      'layouts', 'layouts.' + i + '.tokens_per_s', w.tokens_per_s),
                                 cell(w.mfu === null || w.mfu < 0 ? '–' : (100 * w.mfu).toFixed(1) + ' %',
                                      'layouts', 'layouts.' + i + '.mfu', w.mfu)]));
}

// a cell with its figure's source and exact value
function cell(text, src, key, value) {
  const td = document.createElement('td');
  td.textContent = text;
  if (src) {
    td.dataset.src = src;
    td.dataset.key = key;
    td.dataset.value = JSON.stringify(value);
  }
  return td;
}

function table(el, head, rows) {
  el.replaceChildren();
  const tr = document.createElement('tr');
  for (const h of head) {
    const th = document.createElement('th');
    th.textContent = h;
    tr.appendChild(th);
  }
  el.appendChild(tr);
  for (const r of rows) {
    const row = document.createElement('tr');
    for (const c of r) row.appendChild(typeof c === 'string' ? cell(c) : c);
    el.appendChild(row);
  }
}

const B = (plan, key) => {
  const v = key.split('.').reduce((o, k) => (o === null || o === undefined ? o : o[k]), plan);
  return cell(bytes(v), 'plan', key, v);
};

function showPlan(p) {
  const v = $('verdict');
  v.replaceChildren();
  const d = p.device || {};
  const head = document.createElement('div');
  if (d.memory === null || d.memory === undefined) {
    head.textContent = 'No device given: choose one for the verdict.';
  } else {
    head.textContent = (d.fits ? 'FITS' : 'DOES NOT FIT') + ' on ' + bytes(d.memory) +
      (d.fits ? ' with ' + bytes(d.headroom) + ' to spare' : ': over by ' + bytes(-d.headroom));
    head.className = d.fits ? 'fits' : 'nofit';
    head.dataset.src = 'plan';
    head.dataset.key = 'device.fits';
    head.dataset.value = JSON.stringify(d.fits);
  }
  v.appendChild(head);
  const line = document.createElement('div');
  line.append(p.model + ': ' + p.params.toLocaleString('en') + ' parameters; peak ',
              B(p, 'bytes.peak'), ' allocated, ', B(p, 'reserved.peak'), ' reserved (',
              p.reserved && p.reserved.allocator ? p.reserved.allocator : 'not simulated',
              '), ', B(p, 'bytes.peak_total'), ' with the runtime reserve; during ' +
              p.peak.phase + ' at ' + p.peak.step + '.');
  for (const td of line.querySelectorAll('td')) {
    const span = document.createElement('span');
    span.textContent = td.textContent;
    Object.assign(span.dataset, td.dataset);
    td.replaceWith(span);
  }
  v.appendChild(line);
  const ph = p.peaks.phases;
  const rows = [];
  for (const iter of ['steady', 'first_iteration', 'eval']) {
    if (!ph[iter]) continue;
    for (const phase of Object.keys(ph[iter])) {
      const x = ph[iter][phase];
      if (!x) continue;
      rows.push([iter.replace('_', ' '), phase,
                 cell(bytes(x.peak), 'plan', 'peaks.phases.' + iter + '.' + phase + '.peak', x.peak),
                 x.at || '']);
    }
  }
  table($('phases'), ['iteration', 'phase', 'peak', 'at'], rows);
  const bd = p.peak.breakdown;
  table($('breakdown'), ['category', 'bytes'],
        Object.keys(bd).filter((k) => bd[k]).map((k) => [k.replace(/_/g, ' '),
                                                         B(p, 'peak.breakdown.' + k)]));
  table($('states'), ['state', 'bytes'],
        [['parameters', B(p, 'bytes.params')], ['master weights', B(p, 'bytes.master_params')],
         ['gradients', B(p, 'bytes.grads')], ['optimizer states', B(p, 'bytes.optimizer_states')],
         ['step temporaries', B(p, 'bytes.optimizer_step_temp')],
         ['saved activations', B(p, 'bytes.activations_saved')]]);
}

function showCompare(rows) {
  table($('compare'), ['policy', 'peak', 'device total', 'recompute', 'step', 'fits'],
        rows.map((r, i) => [r.checkpoint,
                            cell(bytes(r.peak), 'compare', i + '.peak', r.peak),
                            cell(bytes(r.peak_total), 'compare', i + '.peak_total', r.peak_total),
                            cell(r.recompute_pct.toFixed(1) + ' %', 'compare', i + '.recompute_pct',
                                 r.recompute_pct),
                            cell(seconds(r.step_time_s), 'compare', i + '.step_time_s',
                                 r.step_time_s),
                            r.fits === null ? '–' : (r.fits ? 'yes' : 'no')]));
}

function showFit(f) {
  const el = $('fit');
  el.replaceChildren();
  if (!f.fits) {
    const no = document.createElement('span');
    no.textContent = 'No micro-batch fits';
    Object.assign(no.dataset, {src: 'fit', key: 'fits', value: 'false'});
    el.append(no, f.note ? ': ' + f.note : '.');
    return;
  }
  const mb = document.createElement('span');
  mb.textContent = f.micro_batch;
  Object.assign(mb.dataset, {src: 'fit', key: 'micro_batch', value: JSON.stringify(f.micro_batch)});
  const pk = document.createElement('span');
  pk.textContent = bytes(f.peak_total);
  Object.assign(pk.dataset, {src: 'fit', key: 'peak_total', value: JSON.stringify(f.peak_total)});
  el.append('Micro-batch ', mb, ' (checkpointing ' + f.plan + '): ', pk,
            ' on the device' + (f.note ? '; ' + f.note : '.'));
}

// the command line's message: PATH:LINE:COL: message, then the line and a
// caret under the column
function showError(e, text) {
  const el = $('error');
  const where = e.path ? e.path + (e.line ? ':' + e.line + ':' + e.col : '') + ': ' : '';
  let msg = where + e.message;
  const lines = text.split('\n');
  if (e.line && e.path && e.line <= lines.length && (e.line < lines.length || lines[e.line - 1])) {
    const line = lines[e.line - 1].replace(/\r$/, '');
    const upto = Array.from(line).slice(0, Math.max(0, e.col - 1));
    msg += '\n  ' + line + '\n  ' + upto.map((c) => (c === '\t' ? '\t' : ' ')).join('') + '^';
  }
  el.textContent = msg;
  el.dataset.status = e.status;
  el.hidden = false;
}

function clearOutputs() {
  for (const id of ['verdict', 'phases', 'breakdown', 'states', 'timeline', 'compare', 'fit',
                    'layouts', 'layouts-note'])
    $(id).replaceChildren();
}

function update() {
  if (!M) return;
  saveState();
  const model = modelNow();
  if (!model.text) return;
  const t0 = performance.now();
  $('error').hidden = true;
  const plan = run('plan', model, settingsFor('plan'));
  if (!plan.ok) {
    clearOutputs();
    showError(plan.error, model.text);
    document.body.dataset.state = 'error';
    return;
  }
  // a bench run (#...&replans=N): the plan N times more, each timed
  const replans = Number(new URLSearchParams(location.hash.slice(1)).get('replans') || 0);
  if (replans > 0 && !document.body.dataset.replanMs) {
    const r0 = performance.now();
    for (let i = 0; i < replans; i++) run('plan', model, settingsFor('plan'));
    document.body.dataset.replanMs = ((performance.now() - r0) / replans).toFixed(3);
  }
  const p = JSON.parse(plan.text);
  showPlan(p);
  const svg = run('svg', model, settingsFor('plan'));
  $('timeline').innerHTML = svg.ok ? svg.text : '';
  const cmp = run('compare', model, settingsFor('compare'));
  if (cmp.ok) showCompare(JSON.parse(cmp.text));
  else table($('compare'), [cmp.error.message], []);
  if (p.device && p.device.memory !== null && p.device.memory !== undefined) {
    const fit = run('fit', model, settingsFor('fit'));
    if (fit.ok) showFit(JSON.parse(fit.text));
    else $('fit').textContent = fit.error.message;
  } else {
    $('fit').textContent = 'Choose a device: fit finds the largest micro-batch on it.';
  }
  if ($('gpus').value.trim() && $('global_batch').value.trim()) {
    const lay = run('layouts', model, settingsFor('layouts'));
    if (lay.ok) showLayouts(JSON.parse(lay.text));
    else { $('layouts').replaceChildren(); $('layouts-note').textContent = lay.error.message; }
  } else {
    $('layouts').replaceChildren();
    $('layouts-note').textContent = 'Give the devices and the global batch to search the layouts.';
  }
  const ms = performance.now() - t0;
  $('timing').textContent = 'Planned in ' + ms.toFixed(1) +
    ' ms (plan, timeline, every checkpointing policy and fit) in this browser.';
  // for the bench: this update's time, and the first's since the page began
  document.body.dataset.updateMs = ms.toFixed(2);
  if (!document.body.dataset.firstMs) document.body.dataset.firstMs = performance.now().toFixed(2);
  document.body.dataset.state = 'done';
}

function schedule() {
  clearTimeout(pending);
  pending = setTimeout(update, 60);
}

// the state in the address: the preset (or the pasted text) and every input
function saveState() {
  const q = new URLSearchParams();
  if (custom) {
    q.set('text', custom.text);
    q.set('name', custom.name);
    if (custom.hf) q.set('hf', '1');
  } else {
    q.set('model', $('preset').value);
  }
  for (const [id] of FIELDS.concat(SEARCH)) if ($(id).value.trim()) q.set(id, $(id).value.trim());
  const old = new URLSearchParams(location.hash.slice(1));
  if (old.get('replans')) q.set('replans', old.get('replans'));
  history.replaceState(null, '', '#' + q.toString());
}

function loadState() {
  const q = new URLSearchParams(location.hash.slice(1));
  if (q.get('text') !== null) {
    custom = {text: q.get('text'), hf: q.get('hf') === '1', name: q.get('name') || 'pasted'};
    $('model-text').value = custom.text;
    $('paste-box').open = true;
  } else if (q.get('model') && PRESETS[q.get('model')] !== undefined) {
    $('preset').value = q.get('model');
  }
  for (const [id] of FIELDS.concat(SEARCH)) if (q.get(id) !== null) $(id).value = q.get(id);
}

function useText(text, name) {
  const t = text.trim();
  custom = {text: text, hf: t.startsWith('{'), name: name || (t.startsWith('{') ? 'config.json' : 'model.yaml')};
  schedule();
}

function setup() {
  const sel = $('preset');
  for (const name of Object.keys(PRESETS).sort()) {
    const o = document.createElement('option');
    o.value = o.textContent = name;
    sel.appendChild(o);
  }
  if (PRESETS['gpt2-small.yaml'] !== undefined) sel.value = 'gpt2-small.yaml';
  const devs = JSON.parse(M.UTF8ToString(M.ccall('mlw_devices', 'number', [], [])));
  for (const d of devs) {
    const o = document.createElement('option');
    o.value = d.name;
    o.textContent = d.name + ' (' + bytes(d.memory) + ')';
    $('device').appendChild(o);
  }
  $('version').textContent = 'Version ' + M.ccall('mlw_version', 'string', [], []) + '.';
  loadState();
  sel.addEventListener('change', () => { custom = null; schedule(); });
  for (const [id] of FIELDS.concat(SEARCH)) {
    $(id).addEventListener('input', schedule);
    $(id).addEventListener('change', schedule);
  }
  $('use-text').addEventListener('click', () => useText($('model-text').value));
  $('model-text').addEventListener('input', () => {
    if ($('model-text').value.trim()) useText($('model-text').value);
  });
  document.addEventListener('dragover', (e) => e.preventDefault());
  document.addEventListener('drop', (e) => {
    e.preventDefault();
    const f = e.dataTransfer.files[0];
    if (!f) return;
    f.text().then((t) => { $('model-text').value = t; $('paste-box').open = true; useText(t, f.name); });
  });
  window.addEventListener('hashchange', () => { loadState(); schedule(); });
  update();
}

createMemledger().then((mod) => { M = mod; setup(); });
