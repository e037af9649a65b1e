// Markdown for model answers. Raw HTML in the text is shown as text (never
// rendered), code blocks are highlighted, and the HTML produced is sanitized
// again by DOMPurify before it reaches the page.
import { Marked } from 'marked';
import DOMPurify from 'dompurify';
import hljs from 'highlight.js/lib/core';
import bash from 'highlight.js/lib/languages/bash';
import c from 'highlight.js/lib/languages/c';
import cpp from 'highlight.js/lib/languages/cpp';
import css from 'highlight.js/lib/languages/css';
import diff from 'highlight.js/lib/languages/diff';
import go from 'highlight.js/lib/languages/go';
import java from 'highlight.js/lib/languages/java';
import javascript from 'highlight.js/lib/languages/javascript';
import jsonLang from 'highlight.js/lib/languages/json';
import python from 'highlight.js/lib/languages/python';
import rust from 'highlight.js/lib/languages/rust';
import sql from 'highlight.js/lib/languages/sql';
import typescript from 'highlight.js/lib/languages/typescript';
import xml from 'highlight.js/lib/languages/xml';
import yaml from 'highlight.js/lib/languages/yaml';

for (const [name, lang] of Object.entries({ bash, c, cpp, css, diff, go, java, javascript, json: jsonLang, python, rust, sql, typescript, xml, yaml }))
  hljs.registerLanguage(name, lang);
hljs.registerAliases(['sh', 'shell'], { languageName: 'bash' });
hljs.registerAliases(['js'], { languageName: 'javascript' });
hljs.registerAliases(['ts'], { languageName: 'typescript' });
hljs.registerAliases(['py'], { languageName: 'python' });
hljs.registerAliases(['html'], { languageName: 'xml' });
hljs.registerAliases(['c++'], { languageName: 'cpp' });

export const escapeHtml = (s) =>
  String(s).replace(/[&<>"']/g, (ch) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[ch]);

const marked = new Marked({
  gfm: true,
  renderer: {
    html(token) { return escapeHtml(token.raw ?? token.text); },
    code(token) {
      const lang = (token.lang || '').split(/\s/)[0].toLowerCase();
      const body = lang && hljs.getLanguage(lang)
        ? hljs.highlight(token.text, { language: lang, ignoreIllegals: true }).value
        : escapeHtml(token.text);
      return `<pre><code class="hljs">${body}</code></pre>\n`;
    },
    // Images would load from anywhere; show the link instead (the CSP blocks
    // other origins too).
    image(token) { return `<a href="${escapeHtml(token.href)}">${escapeHtml(token.text || token.href)}</a>`; },
  },
});

DOMPurify.addHook('afterSanitizeAttributes', (node) => {
  if (node.tagName === 'A') {
    node.setAttribute('target', '_blank');
    node.setAttribute('rel', 'noopener noreferrer');
  }
});

export function renderMarkdown(text) {
  const html = marked.parse(text || '', { async: false });
  return DOMPurify.sanitize(html, {
    FORBID_TAGS: ['style', 'img', 'svg', 'math', 'form', 'input', 'button', 'textarea', 'iframe'],
    FORBID_ATTR: ['style'],
  });
}
