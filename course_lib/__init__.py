"""course_lib: the library behind the distributed deep learning course kit, for every lecture."""
