// A virtualised list of variable-height items: only the items near the
// viewport are in the DOM, between two spacers sized from measured (or
// estimated) heights. Items are only ever appended. It sticks to the bottom
// while the reader is there (a live log), and keeps what the reader looks at
// still when items above it change height.
//
// An item is `{ el?: Element, build(): Element, estimate: number }`; `build`
// is called the first time the item is shown and the element is kept.

export class VirtualList {
  constructor(scroller, { overscan = 900, onStickChange } = {}) {
    this.scroller = scroller;
    this.overscan = overscan;
    this.onStickChange = onStickChange;
    this.items = [];
    this.heights = [];
    this.measured = [];
    this.prefix = [0];
    this.prefixValid = 0; // prefix[0..prefixValid] are right
    this.start = 0;
    this.end = 0;
    this.stick = true;
    this.raf = 0;
    this.inner = document.createElement('div');
    this.inner.className = 'vl-inner';
    this.top = document.createElement('div');
    this.bottom = document.createElement('div');
    this.top.setAttribute('aria-hidden', 'true');
    this.bottom.setAttribute('aria-hidden', 'true');
    this.inner.append(this.top, this.bottom);
    scroller.append(this.inner);
    this.ro = new ResizeObserver((entries) => this.onResize(entries));
    this.lastScrollTop = 0;
    this.onScroll = () => {
      const st = scroller.scrollTop;
      const atBottom = scroller.scrollHeight - st - scroller.clientHeight < 48;
      // Only the reader scrolling up leaves the bottom; growth below does not.
      if (atBottom) this.setStick(true);
      else if (st < this.lastScrollTop - 2) this.setStick(false);
      this.lastScrollTop = st;
      this.schedule();
    };
    scroller.addEventListener('scroll', this.onScroll, { passive: true });
    this.onWheel = (e) => { if (e.deltaY < 0) this.setStick(false); };
    scroller.addEventListener('wheel', this.onWheel, { passive: true });
  }

  setStick(value) {
    if (this.stick === value) return;
    this.stick = value;
    this.onStickChange?.(value);
  }

  get length() {
    return this.items.length;
  }

  append(item) {
    this.items.push(item);
    this.heights.push(item.estimate || 48);
    this.schedule();
  }

  /** An item that was never shown grew: take its new estimate. */
  estimate(index, height) {
    if (this.measured[index] || this.heights[index] === height) return;
    this.heights[index] = height;
    this.invalidate(index);
    this.schedule();
  }

  invalidate(index) {
    this.prefixValid = Math.min(this.prefixValid, index);
  }

  offset(index) {
    if (this.prefixValid < index) {
      for (let i = this.prefixValid; i < index; i++) this.prefix[i + 1] = this.prefix[i] + this.heights[i];
      this.prefixValid = index;
    }
    return this.prefix[index];
  }

  total() {
    return this.offset(this.items.length);
  }

  /** The first index whose bottom is below `y`. */
  indexAt(y) {
    const n = this.items.length;
    this.offset(n);
    let lo = 0;
    let hi = n;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (this.prefix[mid + 1] <= y) lo = mid + 1; else hi = mid;
    }
    return Math.min(lo, Math.max(n - 1, 0));
  }

  schedule() {
    if (this.raf) return;
    this.raf = requestAnimationFrame(() => {
      this.raf = 0;
      this.update();
    });
  }

  scrollToBottom() {
    this.setStick(true);
    this.update();
  }

  update() {
    const n = this.items.length;
    const viewH = this.scroller.clientHeight || 600;
    const total = this.total();
    let viewTop = this.scroller.scrollTop;
    if (this.stick) viewTop = Math.max(0, total - viewH);
    let s = 0;
    let e = 0;
    if (n > 0) {
      s = this.indexAt(Math.max(0, viewTop - this.overscan));
      e = this.indexAt(viewTop + viewH + this.overscan) + 1;
      e = Math.min(Math.max(e, s + 1), n);
    }
    this.mount(s, e);
    this.top.style.height = `${this.offset(s)}px`;
    this.bottom.style.height = `${Math.max(0, total - this.offset(e))}px`;
    if (this.stick) {
      this.scroller.scrollTop = this.scroller.scrollHeight;
      this.lastScrollTop = this.scroller.scrollTop;
    }
  }

  elementOf(i) {
    const item = this.items[i];
    if (!item.el) {
      item.el = item.build();
      item.el.__vlIndex = i;
    }
    return item.el;
  }

  mount(s, e) {
    const { start, end } = this;
    if (s === start && e === end) return;
    const detach = (i) => {
      const el = this.items[i].el;
      if (el) { this.ro.unobserve(el); el.remove(); }
    };
    const attachBefore = (i, ref) => {
      const el = this.elementOf(i);
      this.inner.insertBefore(el, ref);
      this.ro.observe(el);
    };
    if (e <= start || s >= end || start === end) {
      for (let i = start; i < end; i++) detach(i);
      for (let i = s; i < e; i++) attachBefore(i, this.bottom);
    } else {
      for (let i = start; i < Math.min(s, end); i++) detach(i);
      for (let i = Math.max(e, start); i < end; i++) detach(i);
      const firstKept = Math.max(s, start);
      const ref = firstKept < Math.min(e, end) ? this.items[firstKept].el : this.bottom;
      for (let i = s; i < Math.min(start, e); i++) attachBefore(i, ref);
      for (let i = Math.max(end, s); i < e; i++) attachBefore(i, this.bottom);
    }
    this.start = s;
    this.end = e;
  }

  onResize(entries) {
    const viewTop = this.scroller.getBoundingClientRect().top;
    let shift = 0;
    let changed = false;
    for (const entry of entries) {
      const el = entry.target;
      const i = el.__vlIndex;
      if (i === undefined || !el.isConnected) continue;
      const size = entry.borderBoxSize?.[0]?.blockSize ?? el.offsetHeight;
      const hgt = Math.max(1, Math.round(size));
      this.measured[i] = true;
      if (hgt === this.heights[i]) continue;
      const delta = hgt - this.heights[i];
      // An item wholly above the top edge pushed what the reader sees.
      if (!this.stick && el.getBoundingClientRect().bottom - delta <= viewTop + 1) shift += delta;
      this.heights[i] = hgt;
      this.invalidate(i);
      changed = true;
    }
    if (!changed) return;
    if (shift) {
      this.scroller.scrollTop += shift;
      this.lastScrollTop = this.scroller.scrollTop;
    }
    this.update();
  }

  destroy() {
    cancelAnimationFrame(this.raf);
    this.ro.disconnect();
    this.scroller.removeEventListener('scroll', this.onScroll);
    this.scroller.removeEventListener('wheel', this.onWheel);
  }
}

