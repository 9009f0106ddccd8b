// An agent session's workspace in the chat: what a turn changed (its
// result's `files_changed`, and the diff of its turn end from
// GET /agent/session/{id}/changes?format=patch), and the side card that
// puts files in (drag and drop, or pick: a .tar, .tar.gz, .tgz or
// .tar.zst unpacks into /workspace, any other file is written there) and
// takes the whole workspace out as a .tar.gz.

import * as api from './api.js';
import { h, toast, fmtBytes, fmtInt } from './ui.js';

/** The result's "+added ~modified −deleted" and its Changes button. */
export function changesLine(id, ev) {
  const c = ev.files_changed;
  if (!c) return null;
  const total = c.added + c.modified + c.deleted;
  const summary = h('span', { class: 'kv', testid: 'files-changed', title: 'Files the turn added, modified and deleted' },
    h('span', null, 'files'), h('span', null, `+${fmtInt(c.added)} ~${fmtInt(c.modified)} −${fmtInt(c.deleted)}`));
  if (!total) return summary;
  const panel = h('div', { class: 'diff-panel', testid: 'diff', hidden: true });
  const button = h('button', { type: 'button', class: 'sm ghost', testid: 'show-changes', 'aria-expanded': 'false' }, 'Changes');
  let loaded = false;
  button.addEventListener('click', async () => {
    const open = panel.hidden;
    panel.hidden = !open;
    button.setAttribute('aria-expanded', String(open));
    if (!open || loaded) return;
    panel.replaceChildren(h('p', { class: 'muted small' }, 'Loading the diff…'));
    try {
      const res = await api.get(`/agent/session/${id}/changes?to_seq=${ev.seq}&format=patch`, { raw: true });
      const patch = await res.text();
      panel.replaceChildren(diffView(patch));
      loaded = true;
    } catch (e) {
      panel.replaceChildren(h('p', { class: 'small', role: 'alert' }, e.message));
    }
  });
  return [summary, button, panel];
}

/** A unified diff, each line coloured by what it does. */
function diffView(patch) {
  if (!patch.trim()) return h('p', { class: 'muted small' }, 'No file differs (a file rewritten with the same bytes counts as changed above).');
  const lines = patch.split('\n');
  const kind = (line) => {
    if (line.startsWith('diff ') || line.startsWith('+++') || line.startsWith('---')) return 'file';
    if (line.startsWith('@@')) return 'hunk';
    if (line.startsWith('+')) return 'add';
    if (line.startsWith('-')) return 'del';
    return '';
  };
  return h('pre', { class: 'code diff' }, lines.map((line) => h('span', { class: `diff-${kind(line) || 'ctx'}` }, `${line}\n`)));
}

function isArchive(name) {
  return /\.(tar|tar\.gz|tgz|tar\.zst|tar\.zstd)$/i.test(name);
}

/** Puts `files` into the workspace, one request each; says what went in. */
async function upload(id, files, note) {
  for (const file of files) {
    const path = isArchive(file.name)
      ? `/agent/session/${id}/workspace`
      : `/agent/session/${id}/files/${file.name.split('/').map(encodeURIComponent).join('/')}`;
    note.textContent = `Uploading ${file.name}…`;
    try {
      const done = await api.putRaw(path, file, isArchive(file.name) ? 'application/x-tar' : 'application/octet-stream');
      note.textContent = `${file.name}: ${fmtInt(done.files)} file${done.files === 1 ? '' : 's'}, ${fmtBytes(done.bytes)} into ${done.path}`;
      note.dataset.uploaded = String(Number(note.dataset.uploaded || 0) + 1);
    } catch (e) {
      note.textContent = `${file.name}: ${e.message}`;
      toast(e.message, 'danger');
      return;
    }
  }
}

/** Downloads the workspace as a .tar.gz (read whole, then saved). */
async function download(id, button, note) {
  button.disabled = true;
  note.textContent = 'Packing the workspace…';
  try {
    const res = await api.get(`/agent/session/${id}/workspace?format=tar.gz`, { raw: true });
    const blob = await res.blob();
    const link = h('a', { href: URL.createObjectURL(blob), download: `workspace-${id.slice(0, 8)}.tar.gz` });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(link.href), 60_000);
    note.textContent = `Downloaded ${fmtBytes(blob.size)}`;
    note.dataset.downloaded = String(blob.size);
  } catch (e) {
    note.textContent = e.message;
  } finally {
    button.disabled = false;
  }
}

/** The side card: a drop zone and file picker, and the download button. */
export function workspaceCard(id) {
  const note = h('p', { class: 'muted small', testid: 'workspace-note', role: 'status' },
    'Between turns: drop files or a .tar / .tar.gz here to put them in /workspace.');
  const picker = h('input', { type: 'file', multiple: true, testid: 'upload-input', class: 'sr-only', 'aria-label': 'Files to upload' });
  picker.addEventListener('change', () => upload(id, [...picker.files], note).then(() => { picker.value = ''; }));
  const pick = h('button', { type: 'button', class: 'sm', testid: 'upload' }, 'Upload…');
  pick.addEventListener('click', () => picker.click());
  const get = h('button', { type: 'button', class: 'sm', testid: 'download' }, 'Download .tar.gz');
  get.addEventListener('click', () => download(id, get, note));
  const card = h('div', { class: 'card side-card drop-zone', testid: 'workspace-card' },
    h('h2', null, 'Workspace'), note, h('div', { class: 'row' }, pick, get), picker);
  card.addEventListener('dragover', (e) => { e.preventDefault(); card.classList.add('dragging'); });
  card.addEventListener('dragleave', () => card.classList.remove('dragging'));
  card.addEventListener('drop', (e) => {
    e.preventDefault();
    card.classList.remove('dragging');
    upload(id, [...(e.dataTransfer?.files || [])], note);
  });
  return card;
}
