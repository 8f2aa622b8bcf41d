"""BM25 product search, configured like upstream's Lucene index (pyserini ``LuceneSearcher``).

Upstream indexes, per product, ``" ".join([Title, Description, BulletPoints[0],
option_text]).lower()`` (``option_text`` = ``"name: v1, v2, and name2: ..."``) and searches it
with Lucene's BM25 (k1=0.9, b=0.4) through an English analyzer (stop words, Porter stemmer).
Here the same text goes through :func:`analyze` (lower case, a token pattern that keeps
1-character tokens and decimals such as ``8.5``, Lucene's 33 English stop words, PyStemmer's
Porter stemmer) into ``bm25s`` with ``method="lucene"``. Only documents that contain a query
term count as hits (Lucene returns nothing else); ties keep index order (Lucene's doc-id order).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Sequence

import bm25s
import numpy as np
import Stemmer
from bm25s.stopwords import STOPWORDS_EN

TOKEN_PATTERN = re.compile(r"(?u)\b\w+(?:\.\w+)*\b")
STOPWORDS = frozenset(STOPWORDS_EN)
K1 = 0.9
B = 0.4


class Analyzer:
    """Text -> index terms: lower case, :data:`TOKEN_PATTERN`, stop words, Porter stems."""

    def __init__(self) -> None:
        self._stemmer = Stemmer.Stemmer("porter")
        self._stems: dict[str, str] = {}

    def __call__(self, text: str) -> list[str]:
        words = [w for w in TOKEN_PATTERN.findall(text.lower()) if w not in STOPWORDS]
        missing = [w for w in set(words) if w not in self._stems]
        if missing:
            self._stems.update(zip(missing, self._stemmer.stemWords(missing), strict=True))
        return [self._stems[w] for w in words]


class SearchIndex:
    """A BM25 index over documents; :meth:`search` returns document indices, best first.

    Results are cached (an LRU of ``cache_size`` queries): the index is shared by every env of
    the process and searches repeat a lot in RL rollouts.
    """

    def __init__(self, documents: Sequence[str], cache_size: int = 8192) -> None:
        self.analyzer = Analyzer()
        corpus = [self.analyzer(doc) for doc in documents]
        self.n_docs = len(corpus)
        self._bm25 = bm25s.BM25(method="lucene", k1=K1, b=B)
        if self.n_docs:
            self._bm25.index(corpus, show_progress=False)
        self._cache: OrderedDict[tuple[str, int], tuple[int, ...]] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every document for ``query`` (0 where no query term occurs)."""
        if not self.n_docs:
            return np.zeros(0, dtype=np.float32)
        vocab = self._bm25.vocab_dict
        ids = [vocab[t] for t in self.analyzer(query) if t in vocab and t != ""]
        if not ids:
            return np.zeros(self.n_docs, dtype=np.float32)
        return np.asarray(self._bm25.get_scores_from_ids(ids), dtype=np.float32)

    def search(self, query: str, k: int = 50) -> tuple[int, ...]:
        """Indices of the (at most) ``k`` best documents that contain a query term."""
        key = (query, k)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        scores = self.scores(query)
        matching = np.flatnonzero(scores > 0)
        order = matching[np.argsort(-scores[matching], kind="stable")][:k]
        result = tuple(int(i) for i in order)
        with self._lock:
            self._cache[key] = result
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return result
