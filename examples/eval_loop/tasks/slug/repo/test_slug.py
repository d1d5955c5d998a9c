import unittest

from slug import slugify


class SlugTest(unittest.TestCase):
    def test_words(self):
        self.assertEqual(slugify("Hello Big World"), "hello-big-world")
