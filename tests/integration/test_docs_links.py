"""Project docs point only inside the repository (or at public URLs): every
relative link in README.md and docs/*.md names a file of the repository, and
no doc mentions a path outside it (../shared/..., /work/...)."""
import glob
import os
import re
import unittest

ROOT = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)|^\[[^\]]+\]:\s*(\S+)", re.M)
OUTSIDE = re.compile(r"(?<![\w.])\.\./(?:\.\./)*shared/|/work/|ANCHORS\.md")


def docs():
    return [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


class DocLinks(unittest.TestCase):
    def test_relative_links_stay_in_the_repository(self):
        for path in docs():
            with open(path, encoding="utf-8") as f:
                text = f.read()
            for m in LINK.finditer(text):
                target = (m.group(1) or m.group(2)).split("#")[0]
                if not target or re.match(r"[a-z]+:", target):
                    continue  # an anchor on the same page, or a URL
                full = os.path.realpath(os.path.join(os.path.dirname(path), target))
                with self.subTest(doc=os.path.relpath(path, ROOT), link=target):
                    self.assertTrue(full.startswith(ROOT + os.sep), "points outside the repository")
                    self.assertTrue(os.path.exists(full), "no such file in the repository")

    def test_no_mentions_of_paths_outside(self):
        for path in docs():
            with open(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    with self.subTest(doc=os.path.relpath(path, ROOT), line=n):
                        self.assertIsNone(OUTSIDE.search(line), line)


if __name__ == "__main__":
    unittest.main()
