"""Install layout: `cmake --install` into a scratch prefix, then a host finds the
plugin the documented way (docs/abi.md): pkg-config's `plugindir` variable."""
import glob
import os
import shutil
import subprocess
import tempfile
import unittest

from harness import BUILD


class InstallLayout(unittest.TestCase):
    def setUp(self):
        if not shutil.which("cmake") or not shutil.which("pkg-config"):
            self.skipTest("cmake and pkg-config are needed")
        self.tmp = tempfile.TemporaryDirectory(prefix="parley-install-")
        self.prefix = os.path.join(self.tmp.name, "prefix")
        out = subprocess.run(["cmake", "--install", BUILD, "--prefix", self.prefix],
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)

    def tearDown(self):
        self.tmp.cleanup()

    def pkg_config(self, *args, pc_dir):
        env = dict(os.environ, PKG_CONFIG_PATH=pc_dir)
        env.pop("PKG_CONFIG_LIBDIR", None)
        out = subprocess.run(["pkg-config", *args, "parley"], capture_output=True, text=True,
                             env=env, timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        return out.stdout.strip()

    def pc_dir(self):
        """parley.pc is under <prefix>/lib[/<multiarch>|64]/pkgconfig, never share/."""
        found = glob.glob(os.path.join(self.prefix, "lib*", "**", "parley.pc"), recursive=True)
        self.assertEqual(len(found), 1, found)
        self.assertFalse(os.path.exists(os.path.join(self.prefix, "share", "pkgconfig")))
        d = os.path.dirname(found[0])
        self.assertEqual(os.path.basename(d), "pkgconfig")
        return d

    def test_plugindir_names_the_installed_plugin(self):
        pc_dir = self.pc_dir()
        plugindir = self.pkg_config("--variable=plugindir", pc_dir=pc_dir)
        self.assertTrue(os.path.isfile(os.path.join(plugindir, "parley.so")), plugindir)
        self.assertEqual(os.path.realpath(plugindir),
                         os.path.realpath(os.path.join(os.path.dirname(pc_dir), "parley")))

    def test_cflags_find_the_header(self):
        cflags = self.pkg_config("--cflags", pc_dir=self.pc_dir())
        self.assertTrue(cflags.startswith("-I"), cflags)
        self.assertTrue(os.path.isfile(os.path.join(cflags[2:], "parley", "plugin.h")), cflags)

    def test_prefix_is_relocatable(self):
        """The .pc file finds the prefix relative to itself: a moved tree still works."""
        moved = os.path.join(self.tmp.name, "moved")
        shutil.move(self.prefix, moved)
        self.prefix = moved
        plugindir = self.pkg_config("--variable=plugindir", pc_dir=self.pc_dir())
        self.assertTrue(os.path.isfile(os.path.join(plugindir, "parley.so")), plugindir)


if __name__ == "__main__":
    unittest.main()
