// A small syntax highlighter for python, bash and json (and a generic
// fallback): tokens become spans with classes; text is never parsed as HTML.

const PY_KW = new Set(('False None True and as assert async await break class continue def del elif else except ' +
  'finally for from global if import in is lambda nonlocal not or pass raise return try while with yield match case').split(' '));
const PY_BUILTIN = new Set('print len range str int float list dict set tuple open self super isinstance enumerate zip map filter sorted sum min max abs type repr'.split(' '));
const SH_KW = new Set(('if then else elif fi for while until do done case esac in function return export local ' +
  'echo cd ls cat grep sed awk sudo set unset exit source cp mv rm mkdir touch chmod chown curl wget python python3 pip git make head tail find xargs env printf test true false').split(' '));
const JS_KW = new Set(('const let var function return if else for while do break continue new class extends import export from ' +
  'default try catch finally throw async await yield typeof instanceof in of null undefined true false this switch case').split(' '));

const RULES = {
  python: [
    ['com', /#[^\n]*/y],
    ['str', /(?:[rRbBuUfF]{1,2})?(?:"""[\s\S]*?(?:"""|$)|'''[\s\S]*?(?:'''|$)|"(?:\\.|[^"\\\n])*"?|'(?:\\.|[^'\\\n])*'?)/y],
    ['num', /\b(?:0[xob][\da-fA-F_]+|\d[\d_]*(?:\.\d*)?(?:[eE][+-]?\d+)?j?)\b/y],
    ['word', /[A-Za-z_][\w]*/y],
    ['var', /@[\w.]+/y],
  ],
  bash: [
    ['com', /(?:^|(?<=\s))#[^\n]*/y],
    ['str', /"(?:\\.|[^"\\])*"?|'[^']*'?/y],
    ['var', /\$(?:\{[^}]*\}|\w+|[@#?$!*0-9])/y],
    ['lit', /(?<=\s)--?[\w-]+/y],
    ['num', /\b\d+(?:\.\d+)?\b/y],
    ['word', /[A-Za-z_][\w.-]*/y],
  ],
  json: [
    ['str', /"(?:\\.|[^"\\])*"/y],
    ['num', /-?\b\d+(?:\.\d+)?(?:[eE][+-]?\d+)?\b/y],
    ['lit', /\b(?:true|false|null)\b/y],
  ],
  js: [
    ['com', /\/\/[^\n]*|\/\*[\s\S]*?(?:\*\/|$)/y],
    ['str', /"(?:\\.|[^"\\\n])*"?|'(?:\\.|[^'\\\n])*'?|`(?:\\.|[^`\\])*`?/y],
    ['num', /\b\d+(?:\.\d+)?\b/y],
    ['word', /[A-Za-z_$][\w$]*/y],
  ],
};

const ALIASES = { py: 'python', python3: 'python', sh: 'bash', shell: 'bash', zsh: 'bash', console: 'bash', javascript: 'js', ts: 'js', typescript: 'js', node: 'js' };

export function normalise(lang) {
  if (!lang) return null;
  const l = String(lang).toLowerCase();
  return ALIASES[l] || (RULES[l] ? l : null);
}

export function guessLanguage(text) {
  const t = String(text || '').trim();
  if (!t) return null;
  if ((t.startsWith('{') && t.endsWith('}')) || (t.startsWith('[') && t.endsWith(']'))) {
    try { JSON.parse(t); return 'json'; } catch { /* not json */ }
  }
  if (/^\s*(def |class |import |from \w+ import |print\()/m.test(t)) return 'python';
  if (/^\s*(\$ |#!\/bin\/(ba)?sh|sudo |apt-get |cd |ls\b)/m.test(t)) return 'bash';
  return null;
}

/** A DocumentFragment of `code` with token spans. */
export function highlight(code, lang) {
  const frag = document.createDocumentFragment();
  const text = String(code ?? '');
  const language = normalise(lang);
  const rules = language ? RULES[language] : null;
  if (!rules || text.length > 200000) {
    frag.append(document.createTextNode(text));
    return frag;
  }
  let plain = '';
  const flush = () => { if (plain) { frag.append(document.createTextNode(plain)); plain = ''; } };
  const span = (cls, t) => {
    flush();
    const el = document.createElement('span');
    el.className = `tok-${cls}`;
    el.textContent = t;
    frag.append(el);
  };
  let i = 0;
  outer: while (i < text.length) {
    const c = text[i];
    if (c === ' ' || c === '\n' || c === '\t' || c === '(' || c === ')' || c === ',' || c === ':') {
      plain += c;
      i += 1;
      continue;
    }
    for (const [cls, re] of rules) {
      re.lastIndex = i;
      const m = re.exec(text);
      if (!m || m[0].length === 0) continue;
      const tok = m[0];
      i += tok.length;
      if (cls === 'word') {
        const kind = classify(language, tok, text, i);
        if (kind) span(kind, tok); else plain += tok;
      } else if (cls === 'str' && language === 'json' && /^\s*:/.test(text.slice(i, i + 8))) {
        span('key', tok);
      } else {
        span(cls, tok);
      }
      continue outer;
    }
    plain += c;
    i += 1;
  }
  flush();
  return frag;
}

function classify(language, word, text, end) {
  if (language === 'python') {
    if (PY_KW.has(word)) return 'kw';
    if (text[end] === '(') return 'fn';
    if (PY_BUILTIN.has(word)) return 'fn';
    return null;
  }
  if (language === 'bash') {
    if (SH_KW.has(word)) return 'kw';
    return null;
  }
  if (language === 'js') {
    if (JS_KW.has(word)) return 'kw';
    if (text[end] === '(') return 'fn';
  }
  return null;
}
